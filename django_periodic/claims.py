"""Claiming runs: a batch of runs that may start becomes ``running`` under fresh leases.

On PostgreSQL a claim is one statement, whatever its size: it locks the oldest claimable
runs (skipping rows other processes hold), skips those past their start deadline, marks
the rest running and inserts their leases, all at the database's clock. Elsewhere the same
happens through the ORM in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connections, transaction
from django.db.models import F, Field, Model

from django_periodic import clock, policies
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess

LATE_MESSAGE = "No worker could start it within its misfire grace."


@dataclass(frozen=True)
class Claim:
    """A run this process holds, and the token that proves it."""

    run: Run
    token: UUID
    using: str = "default"
    # When this process made the claim (time.monotonic()), to date the job's real start.
    claimed_at: float = field(default_factory=time.monotonic, compare=False)


@dataclass
class ClaimResult:
    claims: list[Claim] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # schedules of the runs skipped as late


def claim(
    process: SchedulerProcess, now: datetime | None, limit: int, using: str = "default"
) -> list[Claim]:
    """Claim up to ``limit`` runs that may start now, skipping rows other processes hold.

    ``now`` None means the database's clock at the statement (no clock read first).
    """
    return claim_batch(process, now, limit, using).claims


def claim_batch(
    process: SchedulerProcess, now: datetime | None, limit: int, using: str = "default"
) -> ClaimResult:
    """``claim()``, also reporting the schedules of the runs it skipped as too late."""
    if limit <= 0:
        return ClaimResult()
    if connections[using].vendor == "postgresql":
        result = _claim_postgresql(process, now, limit, using)
    else:
        result = _claim_orm(process, now, limit, using)
    promoted = result.late and Run.objects.using(using).promote_queued(result.late)
    if promoted and len(result.claims) < limit:
        # A late run skipped made way for a queued one: it may start now too.
        more = claim_batch(process, now, limit - len(result.claims), using)
        result.claims += more.claims
    return result


def _claim_orm(
    process: SchedulerProcess, now: datetime | None, limit: int, using: str
) -> ClaimResult:
    now = now or clock.now(using)
    result = ClaimResult(late=skip_late(now, using))
    with transaction.atomic(using=using):
        claimable = Run.objects.using(using).claimable(now).select_related("schedule")
        runs = list(claimable.select_for_update(skip_locked=True, of=("self",))[:limit])
        if not runs:
            return result
        Run.objects.using(using).filter(pk__in=[r.pk for r in runs]).update(
            status=Run.Status.RUNNING, attempt=F("attempt") + 1, started_at=now
        )
        leases = [_new_lease(run, process, now) for run in runs]
        Lease.objects.using(using).bulk_create(leases)
    result.claims = [
        Claim(run, lease.token, using) for run, lease in zip(runs, leases, strict=True)
    ]
    return result


def skip_late(now: datetime, using: str = "default") -> list[int]:
    """Skip pending fires no worker started before their start deadline (all were busy);
    return their schedules. A claim on PostgreSQL does this for the runs it picks."""
    late = Run.objects.using(using).filter(
        status=Run.Status.PENDING, attempt=0, start_deadline__lt=now
    )
    with transaction.atomic(using=using):
        rows = list(late.select_for_update(skip_locked=True).values_list("pk", "schedule_id"))
        if rows:
            Run.objects.using(using).filter(pk__in=[pk for pk, _ in rows]).update(
                status=Run.Status.SKIPPED,
                error_code=policies.SKIPPED_START_DEADLINE,
                error_message=LATE_MESSAGE,
                finished_at=now,
            )
    return [schedule_id for _, schedule_id in rows]


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


# The oldest claimable runs, locked; those past their start deadline are skipped, the rest
# run under a new lease each. The outer SELECT has one row even when nothing was claimed,
# so that the skipped runs' schedules come back too.
CLAIM_SQL = """
WITH t AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
picked AS (
    SELECT r.id,
           COALESCE(r.status = 'pending' AND r.attempt = 0 AND r.start_deadline < t.now, false)
           AS late
    FROM {run} r CROSS JOIN t
    WHERE r.status = 'pending' OR (r.status = 'retrying' AND r.next_retry_at <= t.now)
    ORDER BY r.plan_time, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
),
skipped AS (
    UPDATE {run} r SET status = 'skipped', error_code = %(late_code)s,
        error_message = %(late_message)s, finished_at = t.now
    FROM picked p CROSS JOIN t WHERE r.id = p.id AND p.late
    RETURNING r.schedule_id
),
claimed AS (
    UPDATE {run} r SET status = 'running', attempt = r.attempt + 1, started_at = t.now
    FROM picked p CROSS JOIN t WHERE r.id = p.id AND NOT p.late
    RETURNING r.*
),
leased AS (
    INSERT INTO {lease} (run_id, attempt, token, holder, process_id, acquired_at,
                         heartbeat_at, expires_at, outcome)
    SELECT c.id, c.attempt, gen_random_uuid(), %(holder)s, %(process)s, t.now, t.now,
           t.now + s.lease_timeout, ''
    FROM claimed c JOIN {schedule} s ON s.id = c.schedule_id CROSS JOIN t
    RETURNING run_id, token
)
SELECT k.late, l.token, {run_columns}, {schedule_columns}
FROM (SELECT array_agg(schedule_id) AS late FROM skipped) k
LEFT JOIN (claimed c JOIN leased l ON l.run_id = c.id JOIN {schedule} s ON s.id = c.schedule_id)
    ON true
"""


@cache
def _claim_sql(using: str) -> str:
    quote = connections[using].ops.quote_name
    return CLAIM_SQL.format(
        run=quote(Run._meta.db_table),
        lease=quote(Lease._meta.db_table),
        schedule=quote(Schedule._meta.db_table),
        run_columns=", ".join(f"c.{quote(f.column or f.name)}" for f in _fields(Run)),
        schedule_columns=", ".join(f"s.{quote(f.column or f.name)}" for f in _fields(Schedule)),
    )


def _fields(model: type[Model]) -> Sequence[Field[Any, Any]]:
    return model._meta.concrete_fields


def _claim_postgresql(
    process: SchedulerProcess, now: datetime | None, limit: int, using: str
) -> ClaimResult:
    params = {
        "now": now,
        "limit": limit,
        "late_code": policies.SKIPPED_START_DEADLINE,
        "late_message": LATE_MESSAGE,
        "holder": str(process),
        "process": process.pk,
    }
    with connections[using].cursor() as cursor:
        cursor.execute(_claim_sql(using), params)
        rows = cursor.fetchall()
    result = ClaimResult(late=rows[0][0] or [])
    run_count = len(_fields(Run))
    for row in rows:
        if row[1] is None:
            continue  # the one row of a claim that claimed nothing
        run = _instance(Run, row[2 : 2 + run_count], using)
        run.schedule = _instance(Schedule, row[2 + run_count :], using)
        result.claims.append(Claim(run, row[1], using))
    return result


def _instance(model: type[Model], values: Sequence[Any], using: str) -> Any:
    """A model instance from raw column values, converted as a queryset would."""
    connection = connections[using]
    fields = _fields(model)
    converted = []
    for model_field, value in zip(fields, values, strict=True):
        expression = model_field.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(expression)
        converters += model_field.get_db_converters(connection)
        for converter in converters:
            value = converter(value, expression, connection)
        converted.append(value)
    return model.from_db(using, [f.attname for f in fields], converted)
