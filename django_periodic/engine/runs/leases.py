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

from django.db import connections, transaction
from django.db.models import ExpressionWrapper, F, Q, Value
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.fields import DateTimeField
from django.db.models.functions import Now

from django_periodic import signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import arrays, prepared
from django_periodic.engine.loop import wakeups
from django_periodic.engine.planning import overlap
from django_periodic.engine.runs import outcomes, presence
from django_periodic.engine.runs.claim_types import Claim
from django_periodic.models import Lease, LeaseQuerySet, Run, RunQuerySet, SchedulerProcess
from django_periodic.models.processes import HELD_SQL, held_through


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
    if connections[using].vendor == "postgresql":
        # Skip leases the recorder is releasing right now: waiting for them, while the
        # recorder waits for rows this statement locked first, is a deadlock that costs
        # both a second (deadlock_timeout) and the outcomes' retry.
        table = connections[using].ops.quote_name(Lease._meta.db_table)
        unlocked = RawSQL(
            HELD_UNLOCKED_SQL.format(lease=table, held=HELD_SQL),
            [arrays.literal([str(token) for token in tokens]), process.pk],
        )
        held = held.filter(pk__in=unlocked)
    else:
        held = held.filter(token__in=tokens)
    return held.update(heartbeat_at=now, expires_at=_extended(now))


# Driven from the tokens (one probe of the token index each), not from the held leases:
# "token = ANY(...)" let the planner scan every entry of the index of held leases, dead
# ones included, and a busy heartbeat took 250-500 ms with a thousand leases held.
HELD_UNLOCKED_SQL = """
SELECT l.id FROM unnest(%s::uuid[]) AS held(token) JOIN {lease} l ON l.token = held.token
WHERE l.process_id = %s AND {held}
FOR UPDATE OF l SKIP LOCKED
"""


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
        )
        running = runs.filter(status=Run.Status.RUNNING, cancel_requested_at__isnull=True)
        asked = running.update(cancel_requested_at=now)
        overlap.promote_queued(runs.db, schedule_ids)
        if asked:
            wakeups.notify(runs.db)  # the holder checks at its next tick
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
    if connections[using].vendor == "postgresql":
        table = connections[using].ops.quote_name(Lease._meta.db_table)
        with prepared.cursor(using) as cursor:
            sql = MARK_STARTED_SQL.format(lease=table, held=HELD_SQL)
            cursor.execute(sql, [arrays.uuids(tokens)])
            return {token for (token,) in cursor.fetchall()}
    held = Lease.objects.using(using).held().filter(token__in=tokens)
    with transaction.atomic(using=using):
        if held.update(started_at=Now()) == len(tokens):
            return set(tokens)
        return set(held.filter(started_at__isnull=False).values_list("token", flat=True))


# Every job start waits for its mark, and waiting for a disk flush too cost a third of the
# throughput of short jobs: the commit returns before its WAL reaches the disk (set_config,
# local to this statement's transaction). It is visible to every session at once, so a
# crash of our process loses nothing; only a crash of the database server itself within
# wal_writer_delay (200 ms) could lose a mark, and its run would then be run again.
MARK_STARTED_SQL = """
UPDATE {lease} l SET started_at = statement_timestamp()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS without_waiting_for_disk,
     unnest(%s::uuid[]) AS marked(token)
WHERE l.token = marked.token AND {held}
RETURNING l.token
"""


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
        if signals.listened(signals.lease_lost, signals.run_finished):
            signals.send_on_commit(_expired_events(again, lost, now), using)
    return SweepResult(reentered, failed)


def _expired(now: datetime, using: str, orphans: bool) -> "LeaseQuerySet":
    held = Lease.objects.using(using)
    if not orphans or connections[using].vendor != "postgresql":
        return held.expired(now)
    lost = RawSQL(presence.lost_sql(connections[using].ops.quote_name), [])
    return held.held().filter(Q(expires_at__lt=now) | Q(process_id__in=lost))


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
    run = lease.run
    return run.schedule.allow_stale_reentry and run.interruptions < limit
