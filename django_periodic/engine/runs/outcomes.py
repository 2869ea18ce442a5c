"""How attempts end: outcomes decided in Python, made storable, recorded many per statement.

Every outcome first releases its lease *by token*; only the runs whose lease was still held
change. A process that lost a lease (to the sweeper, or at shutdown) can therefore never
overwrite a newer attempt, however many outcomes it records at once. On PostgreSQL a batch
is one statement at the database's clock; elsewhere one transaction through the ORM. A
batch the database refuses is recorded one outcome at a time, so that one bad outcome
fails its own run and no other.
"""

import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.dispatch import Signal

from django_periodic import policies, signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import arrays, clock, prepared
from django_periodic.engine.planning import overlap
from django_periodic.engine.runs import storable
from django_periodic.engine.runs.claim_types import LATE_MESSAGE, Claim
from django_periodic.error_texts import error_text, shown
from django_periodic.models import Lease, Run, Schedule
from django_periodic.models.processes import HELD_SQL, RELEASE_SQL

logger = logging.getLogger("django_periodic")

MAX_RETRY_DELAY = timedelta(days=1)


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed; ``retryable`` False fails the run even with attempts left."""

    code: str
    message: str
    traceback: str = ""
    retryable: bool = True


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt ended: the lease's outcome and the run's new state.

    Built by the functions below, whose result and error texts are as they will be stored
    (``storable_result``, ``storable_text``).
    """

    claim: Claim
    lease_outcome: str
    status: str
    result_json: str | None = None  # the result as stored, in JSON (one encoding per run)
    error_code: str = ""
    error_message: str = ""
    traceback: str = ""
    retry_in: timedelta | None = None
    interrupted: bool = False  # cut short by its process stopping (counts as no attempt)
    started_at: datetime | None = None  # when the job really started, if after the claim

    @property
    def result(self) -> Any:
        """The result as stored (``storable.storable_result``)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def started(self, at: datetime | None) -> "AttemptOutcome":
        return replace(self, started_at=at)


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
    """A failed attempt: retried later while attempts remain, else the run fails. Its texts
    are stored as ``storable_text`` makes them: the message's start, the traceback's end
    (which says where it broke)."""
    run = claim.run
    attempts_used = run.attempt - run.interruptions
    retry = failure.retryable and attempts_used < run.max_attempts
    limit = get_settings().ERROR_MAX_CHARS
    return AttemptOutcome(
        claim,
        Lease.Outcome.RETRY if retry else Lease.Outcome.FAILED,
        Run.Status.RETRYING if retry else Run.Status.FAILED,
        error_code=storable.storable_text(failure.code, storable.ERROR_CODE_MAX_LENGTH),
        error_message=storable.storable_text(failure.message, limit),
        traceback=storable.storable_text(failure.traceback, limit, keep_end=True),
        retry_in=retry_delay(run.schedule.retry_backoff, attempts_used) if retry else None,
    )


def retry_delay(backoff: timedelta, attempts_used: int) -> timedelta:
    """Exponential backoff with jitter: about backoff, 2x, 4x... each between 50% and 100%."""
    exponent = min(attempts_used - 1, 30)
    delay: timedelta = min(backoff * (2**exponent), MAX_RETRY_DELAY)
    return delay * random.uniform(0.5, 1.0)


def timed_out(claim: Claim) -> AttemptOutcome:
    timeout = claim.run.schedule.timeout
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
    again; ``message`` says why it stopped.
    """
    if claim.run.schedule.allow_stale_reentry:
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
    try:
        return _record(outcomes, now, using)
    except policies.CONNECTION_ERRORS:
        raise
    except Exception as error:
        if len(outcomes) == 1:
            return _record_not_storable(outcomes[0], error, now, using)
        logger.warning(
            "The database refused %d outcomes at once (%s); recording them one at a time.",
            len(outcomes),
            shown(error),
        )
        recorded: set[int] = set()
        for outcome in outcomes:
            recorded |= record([outcome], now, using)
        return recorded


def record_one(outcome: AttemptOutcome, now: datetime | None) -> bool:
    """Record one outcome (``record``); whether it was (not: its lease was lost)."""
    claim = outcome.claim
    return claim.run.pk in record([outcome], now, claim.using)


def _record_not_storable(
    outcome: AttemptOutcome, error: Exception, now: datetime | None, using: str
) -> set[int]:
    """Fail the run of an outcome the database refused. Should that be refused too, the run
    keeps its lease until it expires (its process no longer renews it, as it holds the run
    no more) and the sweeper settles it."""
    run_id = outcome.claim.run.pk
    logger.error("Run %s: the database refused its outcome (%s); failing it.", run_id, shown(error))
    try:
        return _record([not_storable(outcome, error)], now, using)
    except policies.CONNECTION_ERRORS:
        raise
    except Exception:
        logger.exception("Run %s: could not fail it either; the sweeper will settle it.", run_id)
        return set()


def _record(outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str) -> set[int]:
    """Record the batch in one transaction (one statement on PostgreSQL)."""
    with transaction.atomic(using=using):
        if connections[using].vendor == "postgresql":
            recorded = _record_postgresql(outcomes, now, using)
        else:
            recorded = _record_orm(outcomes, now or clock.now(using), using)
        overlap.promote_queued(using, _queues_to_move(outcomes, recorded))
        if signals.listened(*ENDING_SIGNALS.values()):
            ended = [o for o in outcomes if o.claim.run.pk in recorded]
            signals.send_on_commit(_events(ended, now), using)
    return recorded


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


def _queues_to_move(outcomes: Sequence[AttemptOutcome], recorded: set[int]) -> set[int]:
    # Only a queue schedule has runs waiting; one left by a policy change is the sweeper's.
    return {
        o.claim.run.schedule_id
        for o in outcomes
        if o.claim.run.pk in recorded
        and o.status in Run.FINAL_STATUSES
        and o.claim.run.schedule.overlap == Schedule.Overlap.QUEUE
    }


def _record_orm(outcomes: Sequence[AttemptOutcome], now: datetime, using: str) -> set[int]:
    recorded = set()
    for outcome in outcomes:
        held = Lease.objects.using(using).held().filter(token=outcome.claim.token)
        if held.release(now, outcome.lease_outcome):
            run = outcome.claim.run
            Run.objects.using(using).filter(pk=run.pk).update(**_run_fields(outcome, now))
            recorded.add(run.pk)
    return recorded


# What an ended attempt writes on its run depends on its new status: a run skipped (claimed
# ahead, too late to start) never started, and one given back (pending) has not ended, so
# neither has a duration. _run_fields and OUTCOMES_SQL (built from these) both read them;
# tests/test_rules.py checks that the two write the same.
NEVER_STARTED = (Run.Status.SKIPPED,)
NOT_ENDED = (Run.Status.PENDING,)


def _run_fields(outcome: AttemptOutcome, now: datetime) -> dict[str, Any]:
    never_started = outcome.status in NEVER_STARTED
    started_at = None if never_started else outcome.started_at or outcome.claim.run.started_at
    ended = outcome.status not in NOT_ENDED
    retry = outcome.retry_in
    return {
        "status": outcome.status,
        "result": outcome.result,
        "error_code": outcome.error_code,
        "error_message": outcome.error_message,
        "traceback": outcome.traceback,
        "next_retry_at": None if retry is None else now + retry,
        "started_at": started_at,
        "finished_at": now if ended else None,
        "duration": now - started_at if ended and started_at else None,
        "interruptions": F("interruptions") + int(outcome.interrupted),
    }


# The same as _record_orm (the run's fields as _run_fields writes them), for a whole batch
# in one statement.
OUTCOMES_SQL = """
WITH t AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
v AS (
    SELECT * FROM unnest(
        %(token)s::uuid[], %(run_id)s::bigint[], %(lease_outcome)s::text[], %(status)s::text[],
        %(result)s::text[], %(error_code)s::text[], %(error_message)s::text[],
        %(traceback)s::text[], %(retry_in)s::interval[], %(interrupted)s::integer[],
        %(started_at)s::timestamptz[]
    ) AS v (token, run_id, lease_outcome, status, result, error_code, error_message,
            traceback, retry_in, interrupted, started_at)
),
released AS (
    UPDATE {lease} l SET {release}
    FROM v CROSS JOIN t
    WHERE l.token = v.token AND {held}
    RETURNING l.run_id
)
UPDATE {run} r SET
    status = v.status, result = v.result::jsonb, error_code = v.error_code,
    error_message = v.error_message, traceback = v.traceback,
    next_retry_at = t.now + v.retry_in,
    started_at = CASE WHEN v.status IN ({never_started}) THEN NULL
                      ELSE COALESCE(v.started_at, r.started_at) END,
    finished_at = CASE WHEN v.status IN ({not_ended}) THEN NULL ELSE t.now END,
    duration = CASE WHEN v.status IN ({not_ended}) OR v.status IN ({never_started}) THEN NULL
                    ELSE t.now - COALESCE(v.started_at, r.started_at) END,
    interruptions = r.interruptions + v.interrupted
FROM v JOIN released x ON x.run_id = v.run_id CROSS JOIN t
WHERE r.id = v.run_id
RETURNING r.id
"""


@cache
def _record_sql(using: str) -> str:
    quote = connections[using].ops.quote_name
    release = RELEASE_SQL.format(now="t.now", outcome="v.lease_outcome")
    return OUTCOMES_SQL.format(
        run=quote(Run._meta.db_table),
        lease=quote(Lease._meta.db_table),
        release=release,
        held=HELD_SQL,
        never_started=_statuses(NEVER_STARTED),
        not_ended=_statuses(NOT_ENDED),
    )


def _statuses(statuses: Sequence[str]) -> str:
    return ", ".join(f"'{status}'" for status in statuses)


def _record_postgresql(
    outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str
) -> set[int]:
    # Each column as one array literal: psycopg would adapt a list value by value.
    params = {
        "now": now,
        "token": arrays.literal([str(o.claim.token) for o in outcomes]),
        "run_id": arrays.integers([o.claim.run.pk for o in outcomes]),
        "lease_outcome": arrays.literal([o.lease_outcome for o in outcomes]),
        "status": arrays.literal([o.status for o in outcomes]),
        "result": arrays.literal([o.result_json for o in outcomes]),
        "error_code": arrays.literal([o.error_code for o in outcomes]),
        "error_message": arrays.literal([o.error_message for o in outcomes]),
        "traceback": arrays.literal([o.traceback for o in outcomes]),
        "retry_in": arrays.literal([_interval(o.retry_in) for o in outcomes]),
        "interrupted": arrays.integers([int(o.interrupted) for o in outcomes]),
        "started_at": arrays.literal([o.started_at for o in outcomes]),
    }
    with prepared.cursor(using) as cursor:
        cursor.execute(_record_sql(using), params)
        return {row[0] for row in cursor.fetchall()}


def _interval(value: timedelta | None) -> str | None:
    return None if value is None else f"{value.total_seconds()} seconds"
