"""Recording what planning decided: cursors moved by compare-and-set, runs inserted.

A batch is recorded in one savepoint of the planner's transaction: every cursor moves from
the value read to its new one, and only schedules whose cursor moved get their runs. On
PostgreSQL that is one statement whatever the batch size; elsewhere the ORM does it. If the
database refuses a batch (a run breaking one-active-run, a value out of its range), or
preparing it raises, the schedules are recorded one at a time, so one bad row fails alone.
"""

import logging
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q

from django_periodic import choices, policies
from django_periodic.conf import get_settings, tasks_backend_for
from django_periodic.db import arrays
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.planning import overlap
from django_periodic.engine.planning.decisions import Decision, Due, Fire
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped
from django_periodic.models import Run, Schedule
from django_periodic.models.run import (
    COPIED_FROM_SCHEDULE,
    FINISHED_WHEN_RECORDED,
    finished_when_recorded,
    taken_from_schedule,
)
from django_periodic.timing import stagger

logger = logging.getLogger("django_periodic")


# A run recorded: (id, schedule id, scope, plan time, status, error code).
PlannedRow = tuple[int | None, int, str, datetime, str, str]


def record(
    decisions: list[Decision],
    now: datetime,
    using: str,
    inserted: list[PlannedRow] | None = None,
) -> tuple[list[Decision], list[Decision]]:
    """Record a batch; return the decisions applied and those the database refused.

    The schedules' rows must be locked by the current transaction since their cursors were
    read (``plan_due`` selects them ``FOR UPDATE``). A refused decision carries the
    database's error; its schedule's cursor has not moved. With ``inserted``, the runs
    inserted are added to that list (for the signals; it costs a RETURNING).
    """
    try:
        with transaction.atomic(using=using):
            found: list[PlannedRow] = []
            planned = _record(decisions, now, using, found if inserted is not None else None)
    except policies.CONNECTION_ERRORS:
        raise  # the database's failure, not a row's: the loop retries the tick
    except Exception:
        # One row the database refuses must not stop the others: retry one by one.
        logger.exception("Planning a batch failed; planning its schedules one at a time.")
        return _record_one_by_one(decisions, now, using, inserted)
    if inserted is not None:
        inserted += found
    return planned, []


def _record(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    """Advance the cursors, supersede retries, insert the runs; return the decisions applied."""
    if not decisions:
        return []
    if connections[using].vendor == "postgresql":
        return _record_postgresql(decisions, now, using, inserted)
    advanced = _advance_cursors_serialized(decisions, using)
    planned = [d for d in decisions if d.schedule.pk in advanced]
    _supersede_retries(planned, now, using)
    new = _insert_runs(planned, now, using)
    if inserted is not None:
        inserted += [
            (r.pk, r.schedule_id, r.scope, r.plan_time, r.status, r.error_code) for r in new
        ]
    return planned


def _supersede_retries(decisions: list[Decision], now: datetime, using: str) -> None:
    """End the waiting retries that new fires supersede, scope by scope."""
    superseding = [d for d in decisions if d.supersedes]
    if not superseding:
        return
    unscoped = [d.schedule.pk for d in superseding if d.supersedes == ("",)]
    retries = Q(schedule_id__in=unscoped, scope="")
    for decision in superseding:
        if decision.supersedes != ("",):
            retries |= Q(schedule_id=decision.schedule.pk, scope__in=decision.supersedes)
    overlap.supersede_retries(Run.objects.using(using).filter(retries), now)


def _record_one_by_one(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> tuple[list[Decision], list[Decision]]:
    planned: list[Decision] = []
    failed: list[Decision] = []
    for decision in decisions:
        found: list[PlannedRow] | None = None if inserted is None else []
        try:
            with transaction.atomic(using=using):
                planned += _record([decision], now, using, found)
        except policies.CONNECTION_ERRORS:
            raise
        except Exception as exc:
            decision.error = f"Cannot plan: {type(exc).__name__}: {error_text(exc)}"
            failed.append(decision)
            continue
        if inserted is not None and found:
            inserted += found
    return planned, failed


def record_failure(schedule: Due, error: str, using: str) -> bool:
    """Note why a schedule could not be planned; disable it after repeated failures.

    Returns whether it was disabled. The cursor stays, so a fixed row fires from where it
    stopped (its misfire policy decides about the times missed meanwhile).
    """
    limit = get_settings().PLANNING_FAILURE_LIMIT
    # Counted up to the limit only: a count stored past it must not overflow the column.
    failures = min(schedule.planning_failures, limit - 1) + 1
    disable = failures >= limit
    fields = {"planning_failures": failures, "last_error": error}
    if disable:
        fields["enabled"] = False
        logger.error(
            "Disabled schedule %r after %d failures: %s", schedule.name, failures, escaped(error)
        )
    else:
        logger.error("Could not plan schedule %r: %s", schedule.name, escaped(error))
    Schedule.objects.using(using).filter(pk=schedule.pk).update(**fields)
    return disable


def _advance_cursors_serialized(decisions: list[Decision], using: str) -> set[int]:
    # SQLite runs one write transaction at a time (BEGIN IMMEDIATE), so the rows we read
    # cannot have changed under us; executemany of a prepared UPDATE is its fastest form.
    connection = connections[using]
    table = connection.ops.quote_name(Schedule._meta.db_table)
    sql = (
        f"UPDATE {table} SET next_fire_at = %s, last_error = '', planning_failures = 0"
        " WHERE id = %s"
    )
    params = [(_db_datetime(d.cursor, connection), d.schedule.pk) for d in decisions]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return {d.schedule.pk for d in decisions}


def _db_datetime(value: datetime | None, connection: BaseDatabaseWrapper) -> Any:
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def _insert_runs(decisions: list[Decision], now: datetime, using: str) -> list[Run]:
    """Record every fire; a (schedule, scope, plan_time) already recorded is left as it is.
    Returns the runs inserted."""
    runs = [_fire_run(d.schedule, fire, now) for d in decisions for fire in d.fires]
    recorded = _recorded_plan_times(runs, using)
    new = [run for run in runs if (run.schedule_id, run.scope, run.plan_time) not in recorded]
    # No ignore_conflicts: SQLite would then also drop a run that breaks one-active-run.
    return Run.objects.using(using).bulk_create(new)


def _fire_run(schedule: Due, fire: Fire, now: datetime) -> Run:
    # Run.for_schedule, from the columns loaded for it.
    release = _release(schedule, fire)
    return Run(
        schedule_id=schedule.pk,
        scope=fire.scope,
        plan_time=fire.plan_time,
        release_at=release,
        **taken_from_schedule(schedule),
        status=fire.status,
        error_code=fire.error_code,
        error_message=fire.error_message,
        start_deadline=_start_deadline(schedule, fire, release, now),
        finished_at=finished_when_recorded(fire.status, now),
        created_at=now,
    )


def _release(schedule: Due, fire: Fire) -> datetime | None:
    return stagger.release_time(schedule.jitter, schedule.pk, fire.scope, fire.plan_time)


def _start_deadline(
    schedule: Due, fire: Fire, release: datetime | None, now: datetime
) -> datetime | None:
    """A pending run's deadline, counted from its release (a stagger delays its start)."""
    if fire.status != Run.Status.PENDING:
        return None
    return policies.start_deadline(schedule.misfire_grace, release or fire.plan_time, now)


def _recorded_plan_times(runs: list[Run], using: str) -> set[tuple[int, str, datetime]]:
    if not runs:
        return set()
    recorded = Run.objects.using(using).filter(
        trigger__in=choices.LEDGER_TRIGGERS,
        schedule_id__in={run.schedule_id for run in runs},
        plan_time__in={run.plan_time for run in runs},
    )
    return set(recorded.values_list("schedule_id", "scope", "plan_time"))


# One statement for the whole batch: move every cursor by compare-and-set, then insert the
# runs of the schedules whose cursor moved, with what a run copies of its schedule (job,
# arguments, attempts: COPIED_FROM_SCHEDULE) taken from the rows the UPDATE returns (this
# transaction has locked them), its tasks backend by conf.tasks_backend_for's rule in SQL,
# and exclusive as policies.is_exclusive decides it in Python: taken_from_schedule's
# values, which tests/test_rules.py checks the runs against. Only a plan time
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
    SET next_fire_at = c.new_cursor, last_error = '', planning_failures = 0
    FROM batch JOIN unnest(%(old_cursor)s::timestamptz[], %(new_cursor)s::timestamptz[])
        WITH ORDINALITY AS c (old_cursor, new_cursor, shape) USING (shape)
    WHERE s.id = ANY(%(id)s::bigint[]) AND s.id = batch.id AND s.next_fire_at = c.old_cursor
    RETURNING s.id, batch.shape, s.tasks_backend, {copied_of_schedule}
), inserted AS (
    INSERT INTO {run} (
        schedule_id, scope, plan_time, release_at, trigger, status, attempt,
        interruptions, exclusive, start_deadline, finished_at, error_code, error_message, traceback,
        tasks_backend, task_id, created_at, {copied}
    )
    SELECT m.id, f.scope, f.plan_time, f.release_at, 'schedule', f.status, 0, 0,
           f.exclusive, f.start_deadline,
           CASE WHEN f.status IN ({finished_when_recorded}) THEN %(now)s::timestamptz END,
           f.error_code, f.error_message, '',
           COALESCE(NULLIF(m.tasks_backend, ''), %(tasks_backend)s), '', %(now)s,
           {copied_of_moved}
    FROM moved AS m JOIN unnest(
        %(fire_shape)s::bigint[], %(plan_time)s::timestamptz[], %(status)s::text[],
        %(error_code)s::text[], %(error_message)s::text[], %(exclusive)s::boolean[],
        %(start_deadline)s::timestamptz[], %(scope)s::text[], %(release_at)s::timestamptz[]
    ) AS f (
        shape, plan_time, status, error_code, error_message, exclusive, start_deadline, scope,
        release_at
    )
    USING (shape)
    ON CONFLICT {ledger} DO NOTHING
    {returning}
)
SELECT id, NULL::bigint, NULL::text, NULL::timestamptz, NULL::text, NULL::text
FROM batch WHERE id NOT IN (SELECT id FROM moved)
{inserted}
"""
# With the signals' listeners: the runs inserted too (their schedule id is never NULL).
PLAN_RETURNING = "RETURNING id, schedule_id, scope, plan_time, status, error_code"
PLAN_INSERTED = (
    "UNION ALL SELECT id, schedule_id, scope, plan_time, status, error_code FROM inserted"
)


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
        returning="{returning}",
        inserted="{inserted}",
    )


def _record_postgresql(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    # A retry this batch supersedes ends first: it holds the active slot the new run takes.
    # Every cursor then moves: this transaction has held the rows' locks since it read the
    # cursors, so the compare-and-set cannot fail and no retry ends without its successor.
    _supersede_retries(decisions, now, using)
    connection = connections[using]
    returning = inserted is not None
    sql = _record_sql(using).format(
        returning=PLAN_RETURNING if returning else "",
        inserted=PLAN_INSERTED if returning else "",
    )
    with connection.cursor() as cursor:
        # conf.tasks_backend_for() in SQL: the schedule's backend, else the setting's.
        params: dict[str, Any] = {"now": now, "tasks_backend": tasks_backend_for("")}
        params.update(_shapes(decisions, now))
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    stuck = {row[0] for row in rows if row[1] is None}
    if inserted is not None:
        inserted += [row for row in rows if row[1] is not None]
    return [d for d in decisions if d.schedule.pk not in stuck]


def _shapes(decisions: list[Decision], now: datetime) -> dict[str, str]:
    """PLAN_SQL's arrays: each schedule's id and shape, each distinct shape's cursors and
    fires once."""
    shapes: dict[tuple[Any, ...], int] = {}
    ids: list[int] = []
    shape_of: list[int] = []
    cursors: dict[str, list[Any]] = {"old_cursor": [], "new_cursor": []}
    fires: dict[str, list[Any]] = {name: [] for name in FIRE_COLUMNS}
    for d in decisions:
        schedule = d.schedule
        exclusive = policies.is_exclusive(schedule.overlap)
        # A stagger is the schedule's own: a staggered schedule shares its shape with none.
        staggered = schedule.pk if schedule.jitter else None
        key = (schedule.next_fire_at, d.cursor, d.fires, schedule.misfire_grace, exclusive)
        shape = shapes.get((*key, staggered))
        if shape is None:
            shape = shapes[(*key, staggered)] = len(shapes) + 1  # ORDINALITY counts from 1
            cursors["old_cursor"].append(schedule.next_fire_at)
            cursors["new_cursor"].append(d.cursor)
            for fire in d.fires:
                release = _release(schedule, fire)
                deadline = _start_deadline(schedule, fire, release, now)
                row = (shape, fire.plan_time, fire.status, fire.error_code, fire.error_message)
                values = (*row, exclusive, deadline, fire.scope, release)
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
)
