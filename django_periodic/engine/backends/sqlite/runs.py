"""A run's life through the ORM: outcomes recorded, leases marked started, renewed and
swept, in a few statements."""

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from django_periodic.db import clock
from django_periodic.engine.records import NEVER_STARTED, NOT_ENDED, AttemptOutcome, LateRun
from django_periodic.models import Lease, LeaseQuerySet, Run
from django_periodic.models.run import past_finish_by


def of_schedules(using: str, schedule_ids: list[int]) -> Q:
    """A filter of runs to those of these schedules."""
    return Q(schedule_id__in=schedule_ids)


def held_to_extend(
    held: LeaseQuerySet, tokens: Collection[UUID], process_id: int, using: str
) -> LeaseQuerySet:
    """The leases of ``tokens`` among ``held`` that a heartbeat extends."""
    return held.filter(token__in=tokens)


def mark_started(tokens: list[UUID], using: str) -> set[UUID]:
    """Mark these leases started; return the tokens marked (a lost lease is not)."""
    held = Lease.objects.using(using).held().filter(token__in=tokens)
    with transaction.atomic(using=using):
        if held.update(started_at=Now()) == len(tokens):
            return set(tokens)
        return set(held.filter(started_at__isnull=False).values_list("token", flat=True))


def expired_or_orphaned(now: datetime, using: str) -> LeaseQuerySet:
    """Leases held past their expiry (a process that died is known by its heartbeat only:
    there are no session locks here)."""
    return Lease.objects.using(using).expired(now)


def record_outcomes(
    outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str
) -> set[int]:
    """Release each lease still held and write its run's outcome; return the runs written."""
    now = now or clock.now(using)
    recorded = set()
    for outcome in outcomes:
        held = Lease.objects.using(using).held().filter(token=outcome.claim.token)
        if held.release(now, outcome.lease_outcome):
            run = outcome.claim.run
            Run.objects.using(using).filter(pk=run.pk).update(**_run_fields(outcome, now))
            recorded.add(run.pk)
    return recorded


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


# What a late run's record reads, in LateRun's order.
LATE_FIELDS = (
    "pk",
    "schedule_id",
    "schedule__name",
    "scope",
    "plan_time",
    "attempt",
    "status",
    "finish_by",
    "schedule__cancel_when_late",
)


def flag_late(now: datetime, using: str) -> list[LateRun]:
    """Flag the runs past their deadline to finish at ``now`` (``late_at``); return them.

    One SELECT on the deadline index when none is late. When some are, they are read again
    and flagged in one transaction, which SQLite runs alone (BEGIN IMMEDIATE): a run
    another process flagged meanwhile is not read again, so each is returned once."""
    late = Run.objects.using(using).filter(past_finish_by(now))
    if not late.exists():
        return []
    with transaction.atomic(using=using):
        rows = [LateRun(*row) for row in late.values_list(*LATE_FIELDS)]
        late.filter(pk__in=[row.pk for row in rows]).update(late_at=now)
    return rows
