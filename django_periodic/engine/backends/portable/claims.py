"""Claiming through the ORM, on any database: the runs locked, updated, and their leases
inserted, in a few statements (``runs/claims.py`` owns claiming)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.runs import claims
from django_periodic.engine.runs.claim_types import (
    UNLEASABLE_MESSAGE,
    Claim,
    ClaimRequest,
    ClaimResult,
)
from django_periodic.models import RELEASE, Lease, Run


def claim(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    now = now or clock.now(using)
    result = ClaimResult(late=[] if ahead else claims.skip_late(now, using))
    runs_ = Run.objects.using(using)
    with transaction.atomic(using=using):
        claimable = claims.claimable(wanted, now, ahead, using).select_related("schedule")
        by_id = wanted.run_id is not None  # see pg_claims._claim_sql
        locked = claimable.select_for_update(skip_locked=not by_id, of=("self",))
        runs = list(locked[:limit])
        unleasable = [
            run.pk for run in runs if not claims.can_lease(run.schedule.lease_timeout, now)
        ]
        if unleasable:
            result.refused = claims.fail_unclaimed(
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
