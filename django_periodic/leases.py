"""Leases: every guarded statement on a run once a worker has claimed it.

A claim creates a ``Lease`` with a fresh token; from then on every change to the run
first releases (or extends) the lease row *by token*, and only goes on if that matched.
A process that lost its lease to the sweeper therefore can never overwrite a newer attempt.
"""

import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.db.models import Exists, ExpressionWrapper, F, OuterRef, Subquery, Value
from django.db.models.fields import DateTimeField

from django_periodic import policies, wakeups
from django_periodic.conf import get_settings
from django_periodic.models import Lease, Run, RunQuerySet, Schedule, SchedulerProcess

MAX_RETRY_DELAY = timedelta(days=1)


@dataclass(frozen=True)
class Claim:
    """A run this process holds, and the token that proves it."""

    run: Run
    token: UUID
    using: str = "default"


@dataclass(frozen=True)
class Failure:
    code: str
    message: str
    traceback: str = ""
    retryable: bool = True


def claim(
    process: SchedulerProcess, now: datetime, limit: int, using: str = "default"
) -> list[Claim]:
    """Claim up to ``limit`` runs that may start now, skipping rows other processes hold."""
    skip_late(now, using)
    if limit <= 0:
        return []
    with transaction.atomic(using=using):
        claimable = Run.objects.using(using).claimable(now).select_related("schedule")
        runs = list(claimable.select_for_update(skip_locked=True, of=("self",))[:limit])
        if not runs:
            return []
        Run.objects.using(using).filter(pk__in=[r.pk for r in runs]).update(
            status=Run.Status.RUNNING, attempt=F("attempt") + 1, started_at=now
        )
        leases = [_new_lease(run, process, now) for run in runs]
        Lease.objects.using(using).bulk_create(leases)
    return [Claim(run, lease.token, using) for run, lease in zip(runs, leases, strict=True)]


def _new_lease(run: Run, process: SchedulerProcess, now: datetime) -> Lease:
    """The lease for the run's next attempt; also mirrors the claim's UPDATE on ``run``."""
    run.attempt += 1
    run.status, run.started_at = Run.Status.RUNNING, now
    return Lease(
        run=run,
        attempt=run.attempt,
        holder=str(process),
        process=process,
        acquired_at=now,
        heartbeat_at=now,
        expires_at=now + run.schedule.lease_timeout,
    )


def _extended(now: datetime) -> ExpressionWrapper:
    # Each lease keeps its own length (its schedule's lease_timeout): renew by that much.
    return ExpressionWrapper(
        Value(now) + (F("expires_at") - F("heartbeat_at")), output_field=DateTimeField()
    )


def heartbeat(process: SchedulerProcess, now: datetime, using: str = "default") -> int:
    """Extend every lease this process holds in one statement; return how many."""
    process.heartbeat_at = now
    if not SchedulerProcess.objects.using(using).filter(pk=process.pk).update(heartbeat_at=now):
        # Back after the sweeper forgot it (away past stale_after, no lease left): re-register.
        process.save(using=using, force_insert=True)
    held = Lease.objects.using(using).filter(process=process, released_at__isnull=True)
    return held.update(heartbeat_at=now, expires_at=_extended(now))


def extend(claim: Claim, now: datetime) -> bool:
    """Extend one lease; False means it was lost and the job should stop."""
    held = Lease.objects.using(claim.using).filter(token=claim.token, released_at__isnull=True)
    return held.update(heartbeat_at=now, expires_at=_extended(now)) == 1


def succeed(claim: Claim, now: datetime, result: Any) -> bool:
    """Record the run's result; False if the lease was lost (the result is then dropped)."""
    return _finish(
        claim,
        now,
        Lease.Outcome.SUCCEEDED,
        status=Run.Status.SUCCEEDED,
        result=result,
        error_code="",
    )


def fail(claim: Claim, now: datetime, failure: Failure) -> str | None:
    """Record a failed attempt: retry later while attempts remain, else fail the run.

    Returns the run's new status, or None if the lease was lost (the error is dropped).
    """
    run = claim.run
    errors = {
        "error_code": failure.code,
        "error_message": failure.message,
        "traceback": failure.traceback,
    }
    attempts_used = run.attempt - run.interruptions
    if failure.retryable and attempts_used < run.max_attempts:
        retry_at = now + retry_delay(run.schedule.retry_backoff, attempts_used)
        status = Run.Status.RETRYING
        finished = _finish(
            claim, now, Lease.Outcome.RETRY, status=status, next_retry_at=retry_at, **errors
        )
    else:
        status = Run.Status.FAILED
        finished = _finish(claim, now, Lease.Outcome.FAILED, status=status, **errors)
    return status if finished else None


def release(claim: Claim, now: datetime) -> bool:
    """Give up an unfinished run at shutdown.

    With ``allow_stale_reentry`` it goes back to pending so another process starts it at
    once; without, it may have had effects already, so it fails with ``interrupted``.
    """
    interrupted = {"interruptions": F("interruptions") + 1}
    if claim.run.schedule.allow_stale_reentry:
        return _finish(
            claim,
            now,
            Lease.Outcome.RELEASED,
            status=Run.Status.PENDING,
            finished_at=None,
            duration=None,
            **interrupted,
        )
    return _finish(
        claim,
        now,
        Lease.Outcome.INTERRUPTED,
        status=Run.Status.FAILED,
        error_code="interrupted",
        error_message="Its scheduler stopped before the job finished; not run again.",
        **interrupted,
    )


def retry_delay(backoff: timedelta, attempts_used: int) -> timedelta:
    """Exponential backoff with jitter: about backoff, 2x, 4x... each between 50% and 100%."""
    exponent = min(attempts_used - 1, 30)
    delay = min(backoff * (2**exponent), MAX_RETRY_DELAY)
    return delay * random.uniform(0.5, 1.0)


def _finish(claim: Claim, now: datetime, outcome: str, **run_fields: Any) -> bool:
    run = claim.run
    with transaction.atomic(using=claim.using):
        leases = Lease.objects.using(claim.using)
        held = leases.filter(token=claim.token, released_at__isnull=True)
        if not held.update(released_at=now, outcome=outcome):
            return False
        fields = {"finished_at": now, "duration": now - run.started_at, **run_fields}
        Run.objects.using(claim.using).filter(pk=run.pk).update(**fields)
        # Only a queue schedule has runs waiting; one left by a policy change is the sweeper's.
        is_queue = run.schedule.overlap == Schedule.Overlap.QUEUE
        if is_queue and run_fields["status"] in Run.FINAL_STATUSES:
            promote_queued([run.schedule_id], claim.using)
    return True


def timed_out(claim: Claim, now: datetime) -> bool:
    """Fail a run that overran its timeout and grace; its job's late finish will be ignored."""
    timeout = claim.run.schedule.timeout
    return _finish(
        claim,
        now,
        Lease.Outcome.TIMEOUT,
        status=Run.Status.FAILED,
        error_code="timeout",
        error_message=f"Still running {timeout} after it started (its timeout) plus a grace.",
    )


def cancelled(claim: Claim, now: datetime) -> bool:
    """Record that a running job stopped because someone asked it to."""
    return _finish(
        claim,
        now,
        Lease.Outcome.CANCELLED,
        status=Run.Status.CANCELLED,
        error_code="cancelled",
        error_message="Cancelled while running.",
    )


def request_cancel(runs: RunQuerySet, now: datetime) -> tuple[int, int]:
    """Cancel runs that have not started; ask running ones to stop. Returns (cancelled, asked).

    A waiting run (pending, queued or retrying) ends ``cancelled`` at once. A running job
    is told through its context (``cancelled`` turns true); it ends ``cancelled`` when it
    returns, or by its timeout.
    """
    waiting = runs.waiting()
    with transaction.atomic(using=runs.db):
        schedule_ids = set(waiting.values_list("schedule_id", flat=True))
        done = waiting.update(
            status=Run.Status.CANCELLED,
            error_code="cancelled",
            error_message="Cancelled before it started.",
            next_retry_at=None,
            finished_at=now,
        )
        running = runs.filter(status=Run.Status.RUNNING, cancel_requested_at__isnull=True)
        asked = running.update(cancel_requested_at=now)
        promote_queued(schedule_ids, runs.db)
        if asked:
            wakeups.notify(runs.db)  # the holder checks at its next tick
    return done, asked


def cancel_requested(claims: Iterable[Claim], using: str = "default") -> set[int]:
    """Of these claimed runs, those someone asked to stop."""
    ids = [claim.run.pk for claim in claims]
    if not ids:
        return set()
    asked = Run.objects.using(using).filter(pk__in=ids, cancel_requested_at__isnull=False)
    return set(asked.values_list("pk", flat=True))


def skip_late(now: datetime, using: str = "default") -> int:
    """Skip pending fires no worker started before their start deadline (all were busy)."""
    late = Run.objects.using(using).filter(
        status=Run.Status.PENDING, attempt=0, start_deadline__lt=now
    )
    with transaction.atomic(using=using):
        rows = list(late.select_for_update(skip_locked=True).values_list("pk", "schedule_id"))
        if not rows:
            return 0
        skipped = Run.objects.using(using).filter(
            pk__in=[pk for pk, _ in rows], status=Run.Status.PENDING
        )
        count = skipped.update(
            status=Run.Status.SKIPPED,
            error_code=policies.SKIPPED_START_DEADLINE,
            error_message="No worker could start it within its misfire grace.",
            finished_at=now,
        )
        promote_queued({schedule_id for _, schedule_id in rows}, using)
    return count


def promote_queued(schedule_ids: Iterable[int] | None, using: str = "default") -> int:
    """Make the oldest queued run of each schedule pending once it has no active run.

    ``None`` means every schedule: the sweeper's pass for runs a crash left queued.
    """
    runs = Run.objects.using(using)
    oldest = runs.filter(schedule_id=OuterRef("schedule_id"), status=Run.Status.QUEUED)
    active = runs.filter(
        schedule_id=OuterRef("schedule_id"),
        exclusive=True,
        status__in=Run.SLOT_STATUSES,
    )
    candidates = runs.filter(
        status=Run.Status.QUEUED, pk=Subquery(oldest.order_by("plan_time", "pk").values("pk")[:1])
    ).filter(~Exists(active))
    if schedule_ids is not None:
        schedule_ids = list(schedule_ids)
        if not schedule_ids:
            return 0
        candidates = candidates.filter(schedule_id__in=schedule_ids)
    try:
        with transaction.atomic(using=using):
            promoted = candidates.update(status=Run.Status.PENDING)
    except IntegrityError:
        return 0  # another process promoted a run of the same schedule first: it starts
    if promoted:
        wakeups.notify(using)
    return promoted


@dataclass
class SweepResult:
    reentered: int = 0
    failed: int = 0


def sweep(now: datetime, using: str = "default") -> SweepResult:
    """Release expired leases: run again (allow_stale_reentry) or fail with lease_expired."""
    limit = get_settings().STALE_REENTRY_LIMIT
    with transaction.atomic(using=using):
        expired = Lease.objects.using(using).expired(now).select_related("run__schedule")
        locked = expired.select_for_update(skip_locked=True, of=("self",))
        leases = list(locked[: get_settings().PLAN_BATCH_SIZE])
        if not leases:
            return SweepResult()
        Lease.objects.using(using).filter(pk__in=[lease.pk for lease in leases]).update(
            released_at=now, outcome=Lease.Outcome.EXPIRED
        )
        again = [lease for lease in leases if _reenters(lease.run, limit)]
        lost = [lease for lease in leases if lease not in again]
        # A run is claimed only once its previous lease is released, so a running run's
        # unreleased lease is always its current attempt's.
        runs = Run.objects.using(using).filter(status=Run.Status.RUNNING)
        reentered = runs.filter(pk__in=[lease.run_id for lease in again]).update(
            status=Run.Status.PENDING, interruptions=F("interruptions") + 1
        )
        failed = runs.filter(pk__in=[lease.run_id for lease in lost]).update(
            status=Run.Status.FAILED,
            interruptions=F("interruptions") + 1,
            finished_at=now,
            error_code="lease_expired",
            error_message="The process running it stopped heartbeating; its lease expired.",
        )
        promote_queued({lease.run.schedule_id for lease in lost}, using)
    return SweepResult(reentered, failed)


def _reenters(run: Run, limit: int) -> bool:
    return run.schedule.allow_stale_reentry and run.interruptions < limit
