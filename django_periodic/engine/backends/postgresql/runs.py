"""A run's life on PostgreSQL: outcomes recorded, leases marked started, renewed and swept,
each batch in one statement."""

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from functools import cache
from uuid import UUID

from django.db import connections, models
from django.db.models import Q
from django.db.models.expressions import RawSQL

from django_periodic.db import arrays, postgresql, prepared
from django_periodic.db.postgresql import HELD_SQL, RELEASE_SQL
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.records import NEVER_STARTED, NOT_ENDED, AttemptOutcome, LateRun
from django_periodic.models import Lease, LeaseQuerySet, Run, Schedule, SchedulerProcess
from django_periodic.models.run import past_finish_by


def of_schedules(using: str, schedule_ids: list[int]) -> Q | RawSQL:
    """A filter of runs to those of these schedules: one array parameter."""
    # A planner's batch has thousands of ids: one array parameter, not one each.
    column = f"{connections[using].ops.quote_name(Run._meta.db_table)}.schedule_id"
    return RawSQL(
        f"{column} = ANY(%s::bigint[])",
        [arrays.integers(schedule_ids)],
        output_field=models.BooleanField(),
    )


# Driven from the tokens (one probe of the token index each), not from the held leases:
# "token = ANY(...)" let the planner scan every entry of the index of held leases, dead
# ones included, and a busy heartbeat took 250-500 ms with a thousand leases held.
HELD_UNLOCKED_SQL = """
SELECT l.id FROM unnest(%s::uuid[]) AS held(token) JOIN {lease} l ON l.token = held.token
WHERE l.process_id = %s AND {held}
FOR UPDATE OF l SKIP LOCKED
"""


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


def held_to_extend(
    held: LeaseQuerySet, tokens: Collection[UUID], process_id: int, using: str
) -> LeaseQuerySet:
    """The leases of ``tokens`` among ``held`` that a heartbeat extends: those the outcome
    writer is releasing right now are skipped. Waiting for them, while it waits for rows
    this statement locked first, is a deadlock that costs both a second
    (deadlock_timeout) and the outcomes' retry."""
    table = connections[using].ops.quote_name(Lease._meta.db_table)
    unlocked = RawSQL(
        HELD_UNLOCKED_SQL.format(lease=table, held=HELD_SQL),
        [arrays.literal([str(token) for token in tokens]), process_id],
    )
    return held.filter(pk__in=unlocked)


def mark_started(tokens: list[UUID], using: str) -> set[UUID]:
    """Mark these leases started (``MARK_STARTED_SQL``); return the tokens marked."""
    table = connections[using].ops.quote_name(Lease._meta.db_table)
    with prepared.cursor(using) as cursor:
        cursor.execute(MARK_STARTED_SQL.format(lease=table, held=HELD_SQL), [arrays.uuids(tokens)])
        return {token for (token,) in cursor.fetchall()}


def expired_or_orphaned(now: datetime, using: str) -> LeaseQuerySet:
    """Leases held past their expiry, or by a process whose session lock is gone."""
    process_table = connections[using].ops.quote_name(SchedulerProcess._meta.db_table)
    lost = RawSQL(postgresql.lost_sql(process_table), [])
    held = Lease.objects.using(using).held()
    return held.filter(Q(expires_at__lt=now) | Q(process_id__in=lost))


# What the SQLite backend's record_outcomes writes (the run's fields as its _run_fields
# writes them), for a whole batch in one statement. The leases released return their
# outcomes' values: joined back to the batch instead, the planner rescanned the batch for
# every run (quadratic in the batch's size).
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
    RETURNING v.*
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
FROM released v CROSS JOIN t
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


def record_outcomes(
    outcomes: Sequence[AttemptOutcome], now: datetime | None, using: str
) -> set[int]:
    # Each column as one array literal: psycopg would adapt a list value by value.
    params = {
        "now": now,
        "token": arrays.literal([str(o.claim.token) for o in outcomes]),
        "run_id": arrays.integers([o.claim.values.pk for o in outcomes]),
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


# Flag every run past its deadline in one statement, on the deadline index (its condition,
# models.run.past_finish_by, compiled into the WHERE). Two processes flagging at once: the
# second's UPDATE waits for the first's row locks, then finds late_at set and skips those
# rows (READ COMMITTED re-reads them), so each run is returned by one process only.
FLAG_LATE_SQL = """
WITH late AS (
    UPDATE {run} SET late_at = %(now)s
    WHERE {past_finish_by}
    RETURNING id, schedule_id, scope, plan_time, attempt, status, finish_by
)
SELECT late.id, late.schedule_id, s.name, late.scope, late.plan_time, late.attempt,
       late.status, late.finish_by, s.cancel_when_late
FROM late JOIN {schedule} s ON s.id = late.schedule_id
"""


def flag_late(now: datetime, using: str) -> list[LateRun]:
    """Flag the runs past their deadline to finish at ``now`` (``late_at``); return them."""
    quote = connections[using].ops.quote_name
    runs = Run.objects.using(using).filter(past_finish_by(now))
    past, params = rules.condition(runs, "late")
    sql = FLAG_LATE_SQL.format(
        run=quote(Run._meta.db_table),
        schedule=quote(Schedule._meta.db_table),
        past_finish_by=past,
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {"now": now, **params})
        return [LateRun(*row) for row in cursor.fetchall()]
