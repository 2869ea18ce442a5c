"""Claiming runs: a batch of runs that may start becomes ``running`` under fresh leases.

On PostgreSQL a claim is one statement, whatever its size: it locks the oldest claimable
runs (skipping rows other processes hold), skips those past their start deadline, marks
the rest running and inserts their leases, all at the database's clock
(``backends/postgresql/claims.py`` holds that statement). Elsewhere the same happens
through the ORM in one transaction (``backends/portable/claims.py``).

A run that cannot be claimed fails alone (``cannot_claim``): one whose lease would expire
past the range of stored times (its schedule's ``lease_timeout`` is out of range) is failed
by the claim itself, and if a claim fails as a whole, its runs are claimed again one at a
time to find the one at fault.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models.functions import Now

from django_periodic import signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import announcements, clock
from django_periodic.engine import batches
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import fleet, overlap
from django_periodic.engine.runs.claim_types import (
    LATE_MESSAGE,
    Claim,
    ClaimRequest,
    ClaimResult,
    announce_ended,
)
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped
from django_periodic.models import Run, RunQuerySet, SchedulerProcess
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
    result = batches.else_one_by_one(
        partial(_claim_at_once, wanted, now, limit, using, ahead),
        partial(_claim_one_by_one, wanted, now, limit, using, ahead),
        "A claim failed; claiming its runs one at a time.",
    )
    if result.claims and signals.listened(signals.run_started):
        announcements.send_on_commit(map(_started, result.claims), using)
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
    return ledger(using).claim(wanted, now, limit, using, ahead)


def _claim_alone(
    wanted: ClaimRequest, now: datetime | None, using: str, ahead: timedelta | None
) -> ClaimResult:
    with transaction.atomic(using=using):
        return _claim_at_once(wanted, now, 1, using, ahead)


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
    runs = claimable(wanted, now or clock.now(using), ahead, using)
    for run_id in runs.values_list("pk", flat=True)[:limit]:
        alone = replace(wanted, run_id=run_id)
        claimed = batches.refusal(partial(_claim_alone, alone, now, using, ahead))
        if isinstance(claimed, Exception):
            logger.error("Run %s cannot be claimed.", run_id, exc_info=claimed)
            message = f"Cannot claim: {type(claimed).__name__}: {error_text(claimed)}"
            result.refused += fail_unclaimed([run_id], ErrorCode.CANNOT_CLAIM, message, using)
        else:
            result += claimed
    return result


def claimable(
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
