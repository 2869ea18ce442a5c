"""Claiming runs: a batch of runs that may start becomes ``running`` under fresh leases.

On PostgreSQL a claim is one statement, whatever its size: it locks the oldest claimable
runs (skipping rows other processes hold), skips those past their start deadline, marks
the rest running and inserts their leases, all at the database's clock (``pg_claims.py``
holds that statement). Elsewhere the same happens through the ORM in one transaction.

A run that cannot be claimed fails alone (``cannot_claim``): one whose lease would expire
past the range of stored times (its schedule's ``lease_timeout`` is out of range) is failed
by the claim itself, and if a claim fails as a whole, its runs are claimed again one at a
time to find the one at fault.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Now

from django_periodic import policies, signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.engine.backends.postgresql import claims as pg_claims
from django_periodic.engine.planning import fleet, overlap
from django_periodic.engine.runs.claim_types import (
    LATE_MESSAGE,
    UNLEASABLE_MESSAGE,
    Claim,
    ClaimRequest,
    ClaimResult,
    announce_ended,
)
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped
from django_periodic.models import RELEASE, Lease, Run, RunQuerySet, SchedulerProcess
from django_periodic.timing import bounds

logger = logging.getLogger("django_periodic")


def can_lease(lease_timeout: timedelta, now: datetime) -> bool:
    """Whether a lease taken at ``now`` expires within the range of stored times
    (``pg_claims.UNLEASABLE`` says the opposite in SQL)."""
    return lease_timeout < bounds.LATEST - now


def claim(
    process: SchedulerProcess,
    now: datetime | None,
    limit: int,
    using: str = "default",
    *,
    ahead: timedelta | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` runs that may start now, skipping rows other processes hold.

    ``now`` None means the database's clock at the statement (no clock read first). With
    ``ahead``, claim instead pending runs due within ``ahead`` of now and not yet: the
    caller holds them until their plan time, so that they start on time. Only runs that
    ``run_scheduler``'s own workers execute are claimed (none handed to a tasks backend).
    """
    wanted = ClaimRequest(holder=str(process), jobs=fleet.local_jobs(), process_id=process.pk)
    return _claim_repeating(wanted, now, limit, using, ahead).claims


def claim_run(
    run_id: int, holder: str, using: str = "default", *, now: datetime | None = None
) -> Claim | None:
    """Claim one run by id if it may start now, for a worker outside ``run_scheduler`` (a
    tasks backend's, ``holder`` naming it); None if it may not (already claimed, finished,
    cancelled, not due, its job not registered here) or was past its start deadline (then
    skipped). A run left for its job is enqueued again after ``TASKS_PICKUP_TIMEOUT``.

    ``now`` None means the database's clock; ``django_periodic.testing.run_due`` passes the
    time it runs at."""
    wanted = ClaimRequest(holder, fleet.local_jobs(), run_id=run_id, starts_at_once=True)
    claimed = _claim_repeating(wanted, now, 1, using, None).claims
    return claimed[0] if claimed else None


def _claim_repeating(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    """Claim up to ``limit`` runs for ``wanted``; the result also names the schedules of the
    runs skipped as too late, or failed as impossible to claim."""
    if limit <= 0:
        return ClaimResult()
    try:
        result = _claim_at_once(wanted, now, limit, using, ahead)
    except policies.CONNECTION_ERRORS:
        raise  # the database's failure, not a run's: the loop retries
    except Exception:
        # One run the claim cannot take must not stop the others: find it.
        logger.exception("A claim failed; claiming its runs one at a time.")
        result = _claim_one_by_one(wanted, now, limit, using, ahead)
    if result.claims and signals.listened(signals.run_started):
        signals.send_on_commit(map(_started, result.claims), using)
    ended = result.late + result.refused
    promoted = ended and overlap.promote_queued(using, ended)
    if promoted and len(result.claims) < limit and wanted.run_id is None:
        # A run skipped or failed made way for a queued one: it may start now too.
        more = _claim_repeating(wanted, now, limit - len(result.claims), using, ahead)
        result.claims += more.claims
    return result


def _claim_at_once(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    if connections[using].vendor == "postgresql":
        with _undoable(using):
            return pg_claims.claim_postgresql(wanted, now, limit, using, ahead)
    return _claim_orm(wanted, now, limit, using, ahead)


def _undoable(using: str) -> contextlib.AbstractContextManager[Any]:
    """A savepoint if a transaction is open, which a failed statement would spoil;
    nothing in autocommit (no BEGIN and COMMIT spent on every claim)."""
    if connections[using].in_atomic_block:
        return transaction.atomic(using=using)
    return contextlib.nullcontext()


def _claim_one_by_one(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    """Claim the runs a failed claim would have taken, each alone; one that fails even
    alone ends ``failed`` (``cannot_claim``), with the error, and the others are claimed."""
    result = ClaimResult()
    claimable = _claimable(wanted, now or clock.now(using), ahead, using)
    for run_id in claimable.values_list("pk", flat=True)[:limit]:
        try:
            with transaction.atomic(using=using):
                result += _claim_at_once(replace(wanted, run_id=run_id), now, 1, using, ahead)
        except policies.CONNECTION_ERRORS:
            raise
        except Exception as exc:
            logger.exception("Run %s cannot be claimed.", run_id)
            message = f"Cannot claim: {type(exc).__name__}: {error_text(exc)}"
            result.refused += fail_unclaimed([run_id], ErrorCode.CANNOT_CLAIM, message, using)
    return result


def _claimable(
    wanted: ClaimRequest, now: datetime, ahead: timedelta | None, using: str
) -> RunQuerySet:
    """The runs a claim takes, oldest first: those that may start now, or (ahead) those
    due soon; those its workers execute, or the one run it names."""
    runs = Run.objects.using(using).of_jobs(wanted.jobs)
    claimable = runs.coming(now, ahead) if ahead else runs.claimable(now)
    if wanted.run_id is None:
        return claimable.executed_here()
    return claimable.filter(pk=wanted.run_id)


def fail_unclaimed(run_ids: list[int], code: str, message: str, using: str) -> list[int]:
    """Fail runs waiting to start (pending or retrying) that no worker can ever claim, with
    ``code`` and ``message``; return their schedules, whose queued runs may move up.

    One run's failure, never the process's: rare, so a few statements each time.
    """
    waiting = Run.objects.using(using).filter(pk__in=run_ids, status__in=Run.CLAIMABLE_STATUSES)
    with transaction.atomic(using=using):
        rows = list(waiting.select_for_update().values_list("pk", "schedule_id"))
        Run.objects.using(using).filter(pk__in=[pk for pk, _ in rows]).update(
            status=Run.Status.FAILED,
            error_code=code,
            error_message=message[: get_settings().ERROR_MAX_CHARS],
            next_retry_at=None,
            enqueued_at=None,
            finished_at=Now(),
        )
        announce_ended([pk for pk, _ in rows], signals.run_finished, using, duration=None)
    for pk, _ in rows:
        logger.error("Run %s failed (%s): %s", pk, code, escaped(message))
    return [schedule_id for _, schedule_id in rows]


def _started(claim: Claim) -> signals.Event:
    run = claim.run
    return signals.of_run(
        signals.run_started, run, started_at=run.started_at, release_time=run.release_time
    )


def _claim_orm(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    now = now or clock.now(using)
    result = ClaimResult(late=[] if ahead else skip_late(now, using))
    runs_ = Run.objects.using(using)
    with transaction.atomic(using=using):
        claimable = _claimable(wanted, now, ahead, using).select_related("schedule")
        by_id = wanted.run_id is not None  # see pg_claims._claim_sql
        locked = claimable.select_for_update(skip_locked=not by_id, of=("self",))
        runs = list(locked[:limit])
        unleasable = [run.pk for run in runs if not can_lease(run.schedule.lease_timeout, now)]
        if unleasable:
            result.refused = fail_unclaimed(
                unleasable, ErrorCode.CANNOT_CLAIM, UNLEASABLE_MESSAGE, using
            )
            runs = [run for run in runs if run.pk not in unleasable]
        if not runs:
            return result
        runs_.filter(pk__in=[r.pk for r in runs]).update(
            status=Run.Status.RUNNING,
            attempt=F("attempt") + 1,
            started_at=Greatest(Value(now), RELEASE),
            enqueued_at=None,
        )
        leases = [_new_lease(run, wanted, now) for run in runs]
        Lease.objects.using(using).bulk_create(leases)
    result.claims = [
        Claim(run, lease.token, using, db_claimed_at=now)
        for run, lease in zip(runs, leases, strict=True)
    ]
    return result


def skip_late(now: datetime, using: str = "default") -> list[int]:
    """Skip pending fires no worker started before their start deadline (all were busy);
    return their schedules. A claim on PostgreSQL does this for the runs it picks."""
    late = Run.objects.using(using).too_late_to_start(now)
    with transaction.atomic(using=using):
        rows = list(late.select_for_update(skip_locked=True).values_list("pk", "schedule_id"))
        if rows:
            Run.objects.using(using).filter(pk__in=[pk for pk, _ in rows]).update(
                status=Run.Status.SKIPPED,
                error_code=ErrorCode.START_DEADLINE,
                error_message=LATE_MESSAGE,
                finished_at=now,
            )
            announce_ended([pk for pk, _ in rows], signals.run_skipped, using)
    return [schedule_id for _, schedule_id in rows]


def _new_lease(run: Run, wanted: ClaimRequest, now: datetime) -> Lease:
    """The lease for the run's next attempt; also mirrors the claim's UPDATE on ``run``."""
    run.attempt += 1
    run.status, run.started_at = Run.Status.RUNNING, max(now, run.release_time)
    run.enqueued_at = None
    return Lease(
        run=run,
        attempt=run.attempt,
        holder=wanted.holder,
        process_id=wanted.process_id,
        acquired_at=now,
        started_at=now if wanted.starts_at_once else None,
        heartbeat_at=now,
        expires_at=now + run.schedule.lease_timeout,
    )
