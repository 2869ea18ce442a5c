"""Leases once claimed: heartbeats, single outcomes, cancel requests and the sweeper.

A claim (``claims.py``) creates a ``Lease`` with a fresh token; from then on every change to
the run first releases (or extends) the lease row *by token*, and only goes on if that
matched (``outcomes.py`` records endings, many at once). A process that lost its lease to the
sweeper therefore can never overwrite a newer attempt.
"""

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.db.models import ExpressionWrapper, F, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.fields import DateTimeField

from django_periodic import signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import announcements
from django_periodic.engine import overlap
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import outcomes, retries
from django_periodic.models import Lease, LeaseQuerySet, Run, RunQuerySet, SchedulerProcess, limits
from django_periodic.models.processes import held_through


def _extended(now: datetime) -> "ExpressionWrapper[CombinedExpression]":
    # Each lease keeps its own length (its schedule's lease_timeout): renew by that much.
    return ExpressionWrapper(
        Value(now) + (F("expires_at") - F("heartbeat_at")), output_field=DateTimeField()
    )


def heartbeat(
    process: SchedulerProcess,
    now: datetime,
    tokens: Collection[UUID] = (),
    using: str = "default",
) -> int:
    """Note that the process is alive, and extend the leases it still holds (``tokens``) in
    one statement; return how many were extended.

    Only the leases named are extended: a run the process no longer holds (its outcome
    could not be recorded, or its worker failed) keeps its lease until it expires, and the
    sweeper then settles the run.
    """
    process.heartbeat_at = now
    if not SchedulerProcess.objects.using(using).filter(pk=process.pk).update(heartbeat_at=now):
        # Back after the sweeper forgot it (away past stale_after, no lease left): re-register.
        process.save(using=using, force_insert=True)
    if not tokens:
        return 0
    held = Lease.objects.using(using).held().filter(process=process)
    held = ledger(using).held_to_extend(held, tokens, process.pk)
    return held.update(heartbeat_at=now, expires_at=_extended(now))


def still_held(claim: Claim) -> bool:
    """Whether the claim's lease is still held (read only: no row is locked)."""
    return Lease.objects.using(claim.using).held().filter(token=claim.token).exists()


def extend(claim: Claim, now: datetime) -> bool:
    """Extend one lease; False means it was lost and the job should stop."""
    held = Lease.objects.using(claim.using).held().filter(token=claim.token)
    return held.update(heartbeat_at=now, expires_at=_extended(now)) == 1


def timed_out(claim: Claim, now: datetime | None) -> bool:
    """Fail a run that overran its timeout and grace; its job's late finish will be ignored."""
    return outcomes.record_one(outcomes.timed_out(claim), now)


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
            error_code=ErrorCode.CANCELLED,
            error_message="Cancelled before it started.",
            next_retry_at=None,
            finished_at=now,
            **limits.unheld(),
        )
        running = runs.filter(status=Run.Status.RUNNING, cancel_requested_at__isnull=True)
        asked = running.update(cancel_requested_at=now)
        overlap.promote_queued(runs.db, schedule_ids)
        if asked or done:
            # The holder checks at its next tick; a cancelled run may free a limit's slot.
            announcements.notify(runs.db)
    return done, asked


def cancel_requested(process: SchedulerProcess, using: str = "default") -> set[int]:
    """The runs this process holds that someone asked to stop: one query by the leases it
    holds, however many runs it holds."""
    # One filter(): the lease held and the lease of this process are the same lease.
    held_here = Q(leases__process=process) & held_through("leases")
    asked = Run.objects.using(using).filter(held_here, cancel_requested_at__isnull=False)
    return set(asked.values_list("pk", flat=True))


EXPIRED_MESSAGE = "The process running it stopped heartbeating; its lease expired."


@dataclass
class SweepResult:
    reentered: int = 0
    failed: int = 0


def mark_started(tokens: list[UUID], using: str = "default") -> set[UUID]:
    """Mark these leases started, at the database's clock, before their jobs are called;
    return the tokens marked: a lease released meanwhile (lost) is not, and its job must
    not start. One statement."""
    return ledger(using).mark_started(tokens)


def sweep(now: datetime, using: str = "default", *, orphans: bool = False) -> SweepResult:
    """Release expired leases: run again (allow_stale_reentry, or a job that never
    started) or fail with lease_expired. With ``orphans`` (PostgreSQL), the leases of
    processes that lost their session lock (they died, see presence.py) count as expired."""
    limit = get_settings().STALE_REENTRY_LIMIT
    with transaction.atomic(using=using):
        expired = _expired(now, using, orphans).select_related("run__schedule")
        locked = expired.select_for_update(skip_locked=True, of=("self",))
        leases = list(locked[: get_settings().PLAN_BATCH_SIZE])
        if not leases:
            return SweepResult()
        Lease.objects.using(using).filter(pk__in=[lease.pk for lease in leases]).release(
            now, Lease.Outcome.EXPIRED
        )
        again = [lease for lease in leases if _reenters(lease, limit)]
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
            error_code=ErrorCode.LEASE_EXPIRED,
            error_message=EXPIRED_MESSAGE,
        )
        overlap.promote_queued(using, {lease.run.schedule_id for lease in lost})
        if failed and any(lease.run.concurrency_limit_id is not None for lease in lost):
            # Its slot is free: the planners admit a waiting run now, not at their next poll.
            announcements.notify(using)
        if signals.listened(signals.lease_lost, signals.run_finished):
            announcements.send_on_commit(_expired_events(again, lost, now), using)
    return SweepResult(reentered, failed)


def _expired(now: datetime, using: str, orphans: bool) -> "LeaseQuerySet":
    if orphans:
        return ledger(using).expired_or_orphaned(now)
    return Lease.objects.using(using).expired(now)


def _expired_events(again: list[Lease], lost: list[Lease], now: datetime) -> list[signals.Event]:
    """``lease_lost`` for every lease expired, ``run_finished`` for the runs failed for it;
    the runs as the sweep left them (one not running any more was left alone)."""
    events = []
    for lease in again:
        if lease.run.status == Run.Status.RUNNING:
            lost_lease = signals.of_run(
                signals.lease_lost, lease.run, status=Run.Status.PENDING, reentered=True
            )
            events.append(lost_lease)
    for lease in lost:
        run = lease.run
        if run.status != Run.Status.RUNNING:
            continue
        failed = {"status": Run.Status.FAILED, "reason": ErrorCode.LEASE_EXPIRED}
        duration = now - run.started_at if run.started_at else None
        events.append(signals.of_run(signals.lease_lost, run, reentered=False, **failed))
        events.append(signals.of_run(signals.run_finished, run, duration=duration, **failed))
    return events


def _reenters(lease: Lease, limit: int) -> bool:
    """Whether an expired lease's run is run again. One whose job never started is, whatever
    its schedule says: nothing of it ran, so running it is its first and only execution."""
    if lease.started_at is None:
        return True
    return retries.may_run_again(lease.run) and lease.run.interruptions < limit
