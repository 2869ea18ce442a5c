"""How attempts end: outcomes decided in Python, made storable, recorded many per statement.

Every outcome first releases its lease *by token*; only the runs whose lease was still held
change. A process that lost a lease (to the sweeper, or at shutdown) can therefore never
overwrite a newer attempt, however many outcomes it records at once. On PostgreSQL a batch
is one statement at the database's clock; elsewhere one transaction through the ORM. A
batch the database refuses is recorded one outcome at a time, so that one bad outcome
fails its own run and no other.

A failed run of a schedule with ``pause_after_failures`` may pause it: in the same
transaction, its streak is counted and the schedule paused if it reached the threshold
(planning/self_pausing.py), for the whole batch at once. The claim carries the setting,
so a batch without such a failure costs no query more.
"""

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connections, transaction
from django.dispatch import Signal

from django_periodic import signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import CONNECTION_ERRORS, announcements
from django_periodic.engine import batches, overlap
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import self_pausing
from django_periodic.engine.records import LATE_MESSAGE, AttemptOutcome, Claim, Failure
from django_periodic.engine.runs import retries, storable
from django_periodic.error_texts import error_text, shown
from django_periodic.models import Lease, Run, Schedule

logger = logging.getLogger("django_periodic")


def succeeded(claim: Claim, result: Any, started_at: datetime | None = None) -> AttemptOutcome:
    """A job, started at ``started_at``, that returned ``result``: stored as
    ``storable_result`` makes it."""
    return AttemptOutcome(
        claim,
        Lease.Outcome.SUCCEEDED,
        Run.Status.SUCCEEDED,
        result_json=storable.storable_json(result),
        started_at=started_at,
    )


def failed(claim: Claim, failure: Failure) -> AttemptOutcome:
    """A failed attempt: retried later while attempts remain (``retries.py``), else the run
    fails. Its texts
    are stored as ``storable_text`` makes them: the message's start, the traceback's end
    (which says where it broke)."""
    retry_in = retries.retry_in(claim.run, failure.retryable)
    retry = retry_in is not None
    limit = get_settings().ERROR_MAX_CHARS
    return AttemptOutcome(
        claim,
        Lease.Outcome.RETRY if retry else Lease.Outcome.FAILED,
        Run.Status.RETRYING if retry else Run.Status.FAILED,
        error_code=storable.storable_text(failure.code, storable.ERROR_CODE_MAX_LENGTH),
        error_message=storable.storable_text(failure.message, limit),
        traceback=storable.storable_text(failure.traceback, limit, keep_end=True),
        retry_in=retry_in,
    )


def timed_out(claim: Claim) -> AttemptOutcome:
    timeout = claim.values.timeout
    message = f"Still running {timeout} after it started (its timeout) plus a grace."
    return AttemptOutcome(
        claim,
        Lease.Outcome.TIMEOUT,
        Run.Status.FAILED,
        error_code=ErrorCode.TIMEOUT,
        error_message=message,
    )


def cancelled(claim: Claim) -> AttemptOutcome:
    return AttemptOutcome(
        claim,
        Lease.Outcome.CANCELLED,
        Run.Status.CANCELLED,
        error_code=ErrorCode.CANCELLED,
        error_message="Cancelled while running.",
    )


def skipped_late(claim: Claim) -> AttemptOutcome:
    """A claimed run that waited for a thread (prefetched) past its start deadline."""
    return AttemptOutcome(
        claim,
        Lease.Outcome.SKIPPED,
        Run.Status.SKIPPED,
        error_code=ErrorCode.START_DEADLINE,
        error_message=LATE_MESSAGE,
    )


SHUTDOWN_MESSAGE = "Its scheduler stopped before the job finished; not run again."


def released(claim: Claim, message: str = SHUTDOWN_MESSAGE) -> AttemptOutcome:
    """Given up unfinished (at shutdown): back to pending with reentry, else failed.

    Without ``allow_stale_reentry`` the job may have had effects already, so it is not run
    again (unless it is atomic: ``retries.may_run_again``); ``message`` says why it stopped.
    """
    if retries.may_run_again(claim.run):
        return AttemptOutcome(claim, Lease.Outcome.RELEASED, Run.Status.PENDING, interrupted=True)
    return AttemptOutcome(
        claim,
        Lease.Outcome.INTERRUPTED,
        Run.Status.FAILED,
        error_code=ErrorCode.INTERRUPTED,
        error_message=message,
        interrupted=True,
    )


def unstarted(claim: Claim) -> AttemptOutcome:
    """Given up at shutdown before its job started (held for its plan time, or waiting for
    a thread): back to pending for any process, and no attempt spent."""
    return AttemptOutcome(claim, Lease.Outcome.RELEASED, Run.Status.PENDING, interrupted=True)


def not_storable(outcome: AttemptOutcome, error: Exception) -> AttemptOutcome:
    """What is recorded instead of an outcome the database refused: the run fails, without
    a retry (its job ran), with ``error`` as the reason."""
    reason = f"{type(error).__name__}: {error_text(error)}"
    message = f"Its outcome ({outcome.status}) could not be stored: {reason}"
    return replace(
        outcome,
        lease_outcome=Lease.Outcome.FAILED,
        status=Run.Status.FAILED,
        result_json=None,
        error_code=ErrorCode.OUTCOME_NOT_STORABLE,
        error_message=storable.storable_text(message, get_settings().ERROR_MAX_CHARS),
        traceback="",
        retry_in=None,
    )


def record(
    outcomes: Sequence[AttemptOutcome], now: datetime | None = None, using: str = "default"
) -> set[int]:
    """Record outcomes (all of one database); return the ids of the runs that changed.

    A run missing from the result had lost its lease: its outcome was dropped. ``now``
    None means the database's clock at the statement. If the database refuses the batch,
    its outcomes are recorded one at a time, and one it still refuses fails its run
    (``not_storable``). Connection errors are raised: the caller retries the batch.
    """
    if not outcomes:
        return set()
    if len(outcomes) == 1:
        return _record_alone(outcomes[0], now, using)
    return batches.else_one_by_one(
        partial(_record, outcomes, now, using),
        partial(_record_one_by_one, outcomes, now, using),
        f"The database refused {len(outcomes)} outcomes at once; recording them one at a time.",
    )


def _record_one_by_one(
    outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str
) -> set[int]:
    recorded: set[int] = set()
    for outcome in outcomes:
        recorded |= _record_alone(outcome, now, using)
    return recorded


def _record_alone(outcome: AttemptOutcome, now: datetime | None, using: str) -> set[int]:
    recorded = batches.refusal(partial(_record, [outcome], now, using))
    if isinstance(recorded, Exception):
        return _record_not_storable(outcome, recorded, now, using)
    return recorded


def record_one(outcome: AttemptOutcome, now: datetime | None) -> bool:
    """Record one outcome (``record``); whether it was (not: its lease was lost)."""
    claim = outcome.claim
    return claim.values.pk in record([outcome], now, claim.using)


def _record_not_storable(
    outcome: AttemptOutcome, error: Exception, now: datetime | None, using: str
) -> set[int]:
    """Fail the run of an outcome the database refused. Should that be refused too, the run
    keeps its lease until it expires (its process no longer renews it, as it holds the run
    no more) and the sweeper settles it."""
    run_id = outcome.claim.values.pk
    logger.error("Run %s: the database refused its outcome (%s); failing it.", run_id, shown(error))
    try:
        return _record([not_storable(outcome, error)], now, using)
    except CONNECTION_ERRORS:
        raise
    except Exception:
        logger.exception("Run %s: could not fail it either; the sweeper will settle it.", run_id)
        return set()


def record_in_one(outcome: AttemptOutcome, using: str) -> set[int]:
    """Record one outcome at the database's clock in the current transaction, as it is:
    a refusal is raised, not turned into a failure (an atomic job's, runs/atomic.py). No
    savepoint of its own: any error rolls back the job's writes with it, and two round
    trips per run are saved."""
    return _record([outcome], None, using, savepoint=False)


def _record(
    outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str, savepoint: bool = True
) -> set[int]:
    """Record the batch in one transaction (one statement on PostgreSQL)."""
    with _transaction(outcomes, using, savepoint):
        recorded = ledger(using).record_outcomes(outcomes, now)
        overlap.promote_queued(using, _queues_to_move(outcomes, recorded))
        _pause_reached(_streaks_to_judge(outcomes, recorded), now, using)
        if any(_frees_a_slot(o) for o in outcomes if o.claim.values.pk in recorded):
            announcements.notify(using)  # planners admit the runs waiting for it
        if signals.listened(*ENDING_SIGNALS.values()):
            ended = [o for o in outcomes if o.claim.values.pk in recorded]
            announcements.send_on_commit(_events(ended, now), using)
    return recorded


def _pause_reached(schedule_ids: set[int], now: datetime | None, using: str) -> None:
    """Pause those of these schedules whose failures in a row now reach their threshold,
    in a savepoint: should that fail, the outcomes are recorded all the same, and the
    attention pass pauses them later."""
    if not schedule_ids:
        return
    try:
        with transaction.atomic(using=using):
            self_pausing.pause_reached(schedule_ids, now, using)
    except CONNECTION_ERRORS:
        raise
    except Exception:
        logger.exception("Could not judge whether schedules %s pause themselves.", schedule_ids)


# The signal each new status of a recorded outcome sends (pending: given back, none).
ENDING_SIGNALS: dict[str, Signal] = {
    Run.Status.SUCCEEDED: signals.run_finished,
    Run.Status.FAILED: signals.run_finished,
    Run.Status.CANCELLED: signals.run_finished,
    Run.Status.RETRYING: signals.run_retried,
    Run.Status.SKIPPED: signals.run_skipped,
}


def _events(ended: Sequence[AttemptOutcome], now: datetime | None) -> list[signals.Event]:
    events = []
    monotonic = time.monotonic()
    for outcome in ended:
        signal = ENDING_SIGNALS.get(outcome.status)
        if signal is None:
            continue
        run = outcome.claim.run
        extra = {}
        if signal is signals.run_finished:
            started_at = outcome.started_at or run.started_at
            ended_at = now or outcome.claim.db_time(monotonic)
            ran = ended_at - started_at if ended_at and started_at else None
            extra["duration"] = ran
        events.append(
            signals.of_run(
                signal,
                run,
                status=outcome.status,
                reason=outcome.error_code,
                using=outcome.claim.using,
                **extra,
            )
        )
    return events


def announce_released(released: Sequence[AttemptOutcome], recorded: set[int]) -> None:
    """``run_released`` for the runs of ``released`` (given back unfinished at shutdown, and
    recorded) that go back to pending: their attempts ended, and monitors close them."""
    if not signals.listened(signals.run_released):
        return
    signals.send(
        [
            signals.of_run(signals.run_released, o.claim.run, status=o.status, using=o.claim.using)
            for o in released
            if o.claim.values.pk in recorded and o.status == Run.Status.PENDING
        ]
    )


def _transaction(
    outcomes: Sequence[AttemptOutcome], using: str, savepoint: bool
) -> contextlib.AbstractContextManager[Any]:
    """The batch's transaction, or none in autocommit where the batch is one statement
    (``RECORDS_IN_ONE_STATEMENT``), moves up no queued run and may pause no schedule
    (``_may_pause``): a BEGIN and a COMMIT saved, two round trips of three, on most
    batches the outcome writer records."""
    alone = ledger(using).RECORDS_IN_ONE_STATEMENT and not any(
        _moves_a_queue(o) or _may_pause(o) for o in outcomes
    )
    if alone and not connections[using].in_atomic_block:
        return contextlib.nullcontext()
    return transaction.atomic(using=using, savepoint=savepoint)


def _queues_to_move(outcomes: Sequence[AttemptOutcome], recorded: set[int]) -> set[int]:
    return {
        o.claim.values.schedule_id
        for o in outcomes
        if o.claim.values.pk in recorded and _moves_a_queue(o)
    }


def _streaks_to_judge(outcomes: Sequence[AttemptOutcome], recorded: set[int]) -> set[int]:
    return {
        o.claim.values.schedule_id
        for o in outcomes
        if o.claim.values.pk in recorded and _may_pause(o)
    }


def _may_pause(outcome: AttemptOutcome) -> bool:
    """Whether the outcome, recorded, may pause its schedule: it fails a run of a schedule
    with ``pause_after_failures`` (carried by the claim: no query for the others)."""
    return (
        outcome.status == Run.Status.FAILED
        and outcome.claim.values.pause_after_failures is not None
    )


def _frees_a_slot(outcome: AttemptOutcome) -> bool:
    """Whether the outcome, recorded, frees a slot of a concurrency limit: it ends a run
    that holds one (a retry keeps its slot)."""
    final = outcome.status in Run.FINAL_STATUSES
    return final and outcome.claim.values.concurrency_limit_id is not None


def _moves_a_queue(outcome: AttemptOutcome) -> bool:
    """Whether the outcome, recorded, may let a queued run of its schedule move up: it ends
    a run of a queue schedule. (Only a queue schedule has runs waiting; one left by a
    policy change is the sweeper's.)"""
    final = outcome.status in Run.FINAL_STATUSES
    return final and outcome.claim.values.overlap == Schedule.Overlap.QUEUE
