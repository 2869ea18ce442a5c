"""Planning recorded in one statement per batch (``PLAN_SQL``), and a backfill's runs inserted
in one (``planning/recording.py`` and ``planning/backfill.py`` own what is recorded, and work
out what each run holds)."""

from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connections, transaction
from django.db.models.constants import OnConflict

from django_periodic import policies
from django_periodic.conf import tasks_backend_for
from django_periodic.db import arrays
from django_periodic.engine import records
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.records import Decision, PlannedRow, Recorded
from django_periodic.models import Run, Schedule, limits
from django_periodic.models.run import (
    AWAITING_RELEASE,
    COPIED_FROM_SCHEDULE,
    FINISHED_WHEN_RECORDED,
)

# What planning loads besides planner.DECISION_FIELDS: nothing, PLAN_SQL copies the rest.
SNAPSHOT_COLUMNS_LOADED: tuple[str, ...] = ()

# One statement for the whole batch: move every cursor by compare-and-set, then insert the
# runs of the schedules whose cursor moved, with what a run copies of its schedule (job,
# arguments, attempts: COPIED_FROM_SCHEDULE) taken from the rows the UPDATE returns (this
# transaction has locked them), its tasks backend by conf.tasks_backend_for's rule in SQL,
# and exclusive as policies.is_exclusive decides it in Python: taken_from_schedule's
# values, which tests/test_rules.py checks the runs against. The cursor's move adds the
# fires the decision counts (Recorded.counted) to fire_count. Only a plan time
# already recorded is ignored: any other conflict (a second active run) is an error that
# rolls the batch back. It returns the ids whose cursor did not move.
#
# The decisions (status, exclusive, start deadline, cursors) come from Python, where their
# rules live. Most schedules of a batch decide alike (same cursor, same fires), so each
# distinct outcome, a "shape", is sent once and a schedule sends only its id and shape:
# formatting one value per schedule and column cost more than the statement itself.
# "s.id = ANY(ids)" reads the batch's rows by primary key whatever the join's estimate: with
# many shapes (staggered schedules each have their own) the planner scanned the whole
# schedule table for each batch instead (60 ms a batch at 100,000 schedules, and growing).
PLAN_SQL = """
WITH batch AS (
    SELECT * FROM unnest(%(id)s::bigint[], %(shape)s::bigint[]) AS b (id, shape)
), moved AS (
    UPDATE {schedule} AS s
    SET next_fire_at = c.new_cursor, fire_count = s.fire_count + c.counted, last_error = '',
        planning_failures = 0
    FROM batch JOIN unnest(
        %(old_cursor)s::timestamptz[], %(new_cursor)s::timestamptz[], %(counted)s::integer[]
    ) WITH ORDINALITY AS c (old_cursor, new_cursor, counted, shape) USING (shape)
    WHERE s.id = ANY(%(id)s::bigint[]) AND s.id = batch.id AND s.next_fire_at = c.old_cursor
    RETURNING s.id, batch.shape, s.tasks_backend, {copied_of_schedule}
), inserted AS (
    INSERT INTO {run} (
        schedule_id, scope, plan_time, release_at, held_release_at, trigger, status, attempt,
        interruptions, exclusive, start_deadline, finish_by, finished_at, error_code,
        error_message, traceback, tasks_backend, task_id, created_at, {copied}
    )
    SELECT m.id, f.scope, f.plan_time, {release}, {held_release}, 'schedule', f.status, 0, 0,
           f.exclusive, f.start_deadline, f.finish_by,
           CASE WHEN f.status IN ({finished_when_recorded}) THEN %(now)s::timestamptz END,
           f.error_code, f.error_message, '',
           COALESCE(NULLIF(m.tasks_backend, ''), %(tasks_backend)s), '', %(now)s,
           {copied_of_moved}
    FROM moved AS m JOIN unnest(
        %(fire_shape)s::bigint[], %(plan_time)s::timestamptz[], %(status)s::text[],
        %(error_code)s::text[], %(error_message)s::text[], %(exclusive)s::boolean[],
        %(start_deadline)s::timestamptz[], %(scope)s::text[], %(release_at)s::timestamptz[],
        %(finish_by)s::timestamptz[]
    ) AS f (
        shape, plan_time, status, error_code, error_message, exclusive, start_deadline, scope,
        release_at, finish_by
    )
    USING (shape)
    ON CONFLICT {ledger} DO NOTHING
    {returning}
)
SELECT id, NULL::bigint, NULL::text, NULL::timestamptz, NULL::text, NULL::text
FROM batch WHERE id NOT IN (SELECT id FROM moved)
{inserted}
"""


# A run of a limited schedule recorded to start is held (limits.hold, restated: tests/
# test_limits.py checks the runs of both paths alike): its release waits for admission.
HELD_WHEN = "m.concurrency_limit_id IS NOT NULL AND f.status NOT IN ({final})"
RELEASE = f"CASE WHEN {HELD_WHEN} THEN %(held)s::timestamptz ELSE f.release_at END"
HELD_RELEASE = f"CASE WHEN {HELD_WHEN} THEN f.release_at END"


# With the signals' listeners: the runs inserted too (their schedule id is never NULL).
PLAN_RETURNING = "RETURNING id, schedule_id, scope, plan_time, status, error_code"


PLAN_INSERTED = (
    "UNION ALL SELECT id, schedule_id, scope, plan_time, status, error_code FROM inserted"
)


_FINAL = ", ".join(f"'{status}'" for status in limits.FINAL)


@cache
def _record_sql(using: str) -> str:
    """PLAN_SQL for ``using``, with the columns copied (``COPIED_FROM_SCHEDULE``) and the
    statuses finished when recorded (``FINISHED_WHEN_RECORDED``); the returning clauses are
    left to fill."""
    quote = connections[using].ops.quote_name
    return PLAN_SQL.format(
        run=quote(Run._meta.db_table),
        schedule=quote(Schedule._meta.db_table),
        ledger=rules.ledger_conflict(),
        copied=", ".join(COPIED_FROM_SCHEDULE),
        copied_of_schedule=", ".join(f"s.{of}" for of in COPIED_FROM_SCHEDULE.values()),
        copied_of_moved=", ".join(f"m.{of}" for of in COPIED_FROM_SCHEDULE.values()),
        finished_when_recorded=", ".join(f"'{status}'" for status in FINISHED_WHEN_RECORDED),
        release=RELEASE.format(final=_FINAL),
        held_release=HELD_RELEASE.format(final=_FINAL),
        returning="{returning}",
        inserted="{inserted}",
    )


def record_fires(
    decisions: list[Recorded], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    # Every cursor moves: this transaction has held the rows' locks since it read the
    # cursors, so the compare-and-set cannot fail and no retry the batch superseded
    # (planning/recording.py ended them first) ends without its successor.
    connection = connections[using]
    returning = inserted is not None
    sql = _record_sql(using).format(
        returning=PLAN_RETURNING if returning else "",
        inserted=PLAN_INSERTED if returning else "",
    )
    with connection.cursor() as cursor:
        # conf.tasks_backend_for() in SQL: the schedule's backend, else the setting's.
        params: dict[str, Any] = {
            "now": now,
            "tasks_backend": tasks_backend_for(""),
            "held": limits.HELD,
        }
        params.update(_shapes(decisions))
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    stuck = {row[0] for row in rows if row[1] is None}
    if inserted is not None:
        inserted += [row for row in rows if row[1] is not None]
    return [r.decision for r in decisions if r.decision.schedule.pk not in stuck]


def _shapes(decisions: list[Recorded]) -> dict[str, str]:
    """PLAN_SQL's arrays: each schedule's id and shape, each distinct shape's cursors and
    fires once."""
    shapes: dict[tuple[Any, ...], int] = {}
    ids: list[int] = []
    shape_of: list[int] = []
    cursors: dict[str, list[Any]] = {"old_cursor": [], "new_cursor": [], "counted": []}
    fires: dict[str, list[Any]] = {name: [] for name in FIRE_COLUMNS}
    for recorded in decisions:
        d = recorded.decision
        schedule = d.schedule
        exclusive = policies.is_exclusive(schedule.overlap)
        # A stagger is the schedule's own: a staggered schedule shares its shape with none.
        staggered = schedule.pk if schedule.jitter else None
        deadlines = (schedule.misfire_grace, schedule.finish_within)
        key = (schedule.next_fire_at, d.cursor, d.fires, deadlines, exclusive)
        shape = shapes.get((*key, staggered))
        if shape is None:
            shape = shapes[(*key, staggered)] = len(shapes) + 1  # ORDINALITY counts from 1
            cursors["old_cursor"].append(schedule.next_fire_at)
            cursors["new_cursor"].append(d.cursor)
            cursors["counted"].append(recorded.counted)
            for fire, release, deadline, finish_by in recorded.fires:
                row = (shape, fire.plan_time, fire.status, fire.error_code, fire.error_message)
                values = (*row, exclusive, deadline, fire.scope, release, finish_by)
                for name, value in zip(FIRE_COLUMNS, values, strict=True):
                    fires[name].append(value)
        ids.append(schedule.pk)
        shape_of.append(shape)
    columns = {name: arrays.literal(values) for name, values in (cursors | fires).items()}
    return {"id": arrays.integers(ids), "shape": arrays.integers(shape_of), **columns}


FIRE_COLUMNS = (
    "fire_shape",
    "plan_time",
    "status",
    "error_code",
    "error_message",
    "exclusive",
    "start_deadline",
    "scope",
    "release_at",
    "finish_by",
)


# What insert_new_runs returns of each run it inserted (a PlannedRow).
_PLANNED_FIELDS = ("id", "schedule", "scope", "plan_time", "status", "error_code")


def insert_new_runs(runs: list[Run], using: str) -> list[PlannedRow]:
    """Insert these scheduled runs in one statement; a (schedule, scope, plan time) another
    process recorded first is left alone (ON CONFLICT DO NOTHING), and RETURNING names only
    the rows inserted. bulk_create() would not say which those are."""
    if not runs:
        return []
    meta = Run._meta
    fields = [f for f in meta.concrete_fields if f is not meta.pk]
    returning = [meta.get_field(name) for name in _PLANNED_FIELDS]
    rows = Run.objects.using(using)._insert(  # type: ignore[attr-defined]  # bulk_create's own
        runs, fields=fields, returning_fields=returning, on_conflict=OnConflict.IGNORE
    )
    return [tuple(row) for row in rows]


# First, the lock the runs' foreign key takes at commit, taken now: the planner, which
# locks the schedule FOR UPDATE, then skips it (SKIP LOCKED) until this backfill commits,
# rather than wait on a run this inserted while this waits on its lock at commit (a
# deadlock). Backfills of one schedule share this lock and stay concurrent.
LOCK_SQL = "SELECT 1 FROM {schedule} WHERE id = %s FOR KEY SHARE"


# Then one statement: the release of the first run comes after the schedule's last waiting
# backfilled run (or now); the range's plan times that have a run of any trigger are left
# out; and one that another backfill or the planner records meanwhile is ignored by the
# ledger's unique constraint (ON CONFLICT), so no plan time is recorded twice. The release
# times are numbered over the runs inserted, so they come exactly ``spacing`` apart. The
# fields all its runs have alike are _run()'s (_new_run_fields), one parameter each.
INSERT_SQL = """
WITH t AS (
    SELECT GREATEST(%(now)s::timestamptz, MAX(next_retry_at) + %(spacing)s::interval) AS first
    FROM {run}
    WHERE schedule_id = %(schedule)s AND {awaiting_release}
), fresh AS (
    SELECT w.plan_time, k.scope, row_number() OVER (ORDER BY w.plan_time, k.scope) - 1 AS n
    FROM unnest(%(plan_time)s::timestamptz[]) AS w (plan_time)
    CROSS JOIN unnest(%(scope)s::text[]) AS k (scope)
    WHERE NOT EXISTS (
        SELECT 1 FROM {run} r WHERE r.schedule_id = %(schedule)s AND r.scope = k.scope
            AND r.plan_time = w.plan_time
    )
)
INSERT INTO {run} (
    schedule_id, scope, plan_time, next_retry_at, interruptions, error_code, error_message,
    traceback, task_id, created_at, {new_columns}
)
SELECT %(schedule)s, f.scope, f.plan_time, t.first + f.n * %(spacing)s::interval, 0, '', '',
       '', '', %(now)s, {new_values}
FROM fresh f CROSS JOIN t
ORDER BY f.n
ON CONFLICT {ledger} DO NOTHING
RETURNING id, scope, plan_time, next_retry_at
"""


def insert_backfill(
    schedule: Schedule, in_range: records.InRange, now: datetime, spacing: timedelta, using: str
) -> list[records.BackfilledRow]:
    connection = connections[using]
    quote = connection.ops.quote_name
    awaiting, awaiting_params = rules.condition(Run.objects.filter(AWAITING_RELEASE), "awaiting")
    fields = {field.attname: field for field in Run._meta.concrete_fields}
    new = in_range.run_fields
    sql = INSERT_SQL.format(
        run=quote(Run._meta.db_table),
        awaiting_release=awaiting,
        new_columns=", ".join(new),  # fields named as their columns
        new_values=", ".join(f"%(new_{name})s" for name in new),
        ledger=rules.ledger_conflict(),
    )
    params = {
        **awaiting_params,
        **{
            f"new_{name}": fields[name].get_db_prep_save(value, connection)
            for name, value in new.items()
        },
        "now": now,
        "spacing": spacing,
        "schedule": schedule.pk,
        "plan_time": in_range.times,
        "scope": in_range.scopes,
    }
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(LOCK_SQL.format(schedule=quote(Schedule._meta.db_table)), [schedule.pk])
        cursor.execute(sql, params)
        return [(run_id, scope, plan_time, release) for run_id, scope, plan_time, release in cursor]
