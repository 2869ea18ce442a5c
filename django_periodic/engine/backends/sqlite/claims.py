"""Claiming through the ORM: the runs locked, updated, and their leases inserted, in a few
statements (``runs/claims.py`` owns claiming); and the runs a claim ends without running,
skipped as too late or failed as impossible to claim (the engine sends their signals)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Now

from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.engine.records import (
    LATE_MESSAGE,
    UNLEASABLE_MESSAGE,
    Claim,
    ClaimRequest,
    ClaimResult,
    can_lease,
)
from django_periodic.escaping import escaped
from django_periodic.models import Lease, Run, RunQuerySet
from django_periodic.models.run import RELEASE

logger = logging.getLogger("django_periodic")


def claim(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    now = now or clock.now(using)
    result = ClaimResult() if ahead else skip_late(now, using)
    runs_ = Run.objects.using(using)
    with transaction.atomic(using=using):
        claimable_ = claimable(wanted, now, ahead, using).select_related("schedule")
        by_id = wanted.run_id is not None  # see pg_claims._claim_sql
        locked = claimable_.select_for_update(skip_locked=not by_id, of=("self",))
        runs = list(locked[:limit])
        unleasable = [run.pk for run in runs if not can_lease(run.schedule.lease_timeout, now)]
        if unleasable:
            rows = fail_waiting(unleasable, ErrorCode.CANNOT_CLAIM, UNLEASABLE_MESSAGE, using)
            result.refused = [schedule_id for _, schedule_id in rows]
            result.refused_runs = [pk for pk, _ in rows]
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
        Claim.of(run, lease.token, using, db_claimed_at=now)
        for run, lease in zip(runs, leases, strict=True)
    ]
    return result


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


def fail_waiting(run_ids: list[int], code: str, message: str, using: str) -> list[tuple[int, int]]:
    """Fail those of these runs still waiting to start (pending or retrying), with ``code``
    and ``message``; return them (id, schedule id). Rare: a few statements each time."""
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
    for pk, _ in rows:
        logger.error("Run %s failed (%s): %s", pk, code, escaped(message))
    return rows


def skip_late(now: datetime, using: str) -> ClaimResult:
    """Skip pending fires no worker started before their start deadline (all were busy);
    the result names them and their schedules."""
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
    return ClaimResult(
        late=[schedule_id for _, schedule_id in rows], late_runs=[pk for pk, _ in rows]
    )
