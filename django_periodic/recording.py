"""Recording what planning decided: cursors moved by compare-and-set, runs inserted.

A batch is recorded in one savepoint of the planner's transaction: every cursor moves from
the value read to its new one, and only schedules whose cursor moved get their runs. On
PostgreSQL each step is one statement whatever the batch size; elsewhere the ORM does it.
If the database refuses a batch (a run breaking one-active-run), the schedules are recorded
one at a time, so one bad row fails alone.
"""

import logging
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_periodic import policies
from django_periodic.conf import get_settings
from django_periodic.decisions import Decision, Due, Fire
from django_periodic.models import Run, Schedule

logger = logging.getLogger("django_periodic")


def record(
    decisions: list[Decision], now: datetime, using: str
) -> tuple[list[Decision], list[Decision]]:
    """Record a batch; return the decisions applied and those the database refused.

    A refused decision carries the database's error; its schedule's cursor has not moved.
    """
    try:
        with transaction.atomic(using=using):
            return _record(decisions, now, using), []
    except DatabaseError:
        # One row the database refuses must not stop the others: retry one by one.
        logger.exception("Planning a batch failed; planning its schedules one at a time.")
        return _record_one_by_one(decisions, now, using)


def _record(decisions: list[Decision], now: datetime, using: str) -> list[Decision]:
    """Advance the cursors, supersede retries, insert the runs; return the decisions applied."""
    advanced = _advance_cursors(decisions, using)
    planned = [d for d in decisions if d.schedule.pk in advanced]
    superseding = [d.schedule.pk for d in planned if d.supersedes_retry]
    if superseding:
        Run.objects.using(using).filter(schedule_id__in=superseding).supersede_retries(now)
    _insert_runs(planned, now, using)
    return planned


def _record_one_by_one(
    decisions: list[Decision], now: datetime, using: str
) -> tuple[list[Decision], list[Decision]]:
    planned: list[Decision] = []
    failed: list[Decision] = []
    for decision in decisions:
        try:
            with transaction.atomic(using=using):
                planned += _record([decision], now, using)
        except DatabaseError as exc:
            decision.error = f"Cannot plan: {exc}"
            failed.append(decision)
    return planned, failed


def record_failure(schedule: Due, error: str, using: str) -> bool:
    """Note why a schedule could not be planned; disable it after repeated failures.

    Returns whether it was disabled. The cursor stays, so a fixed row fires from where it
    stopped (its misfire policy decides about the times missed meanwhile).
    """
    failures = schedule.planning_failures + 1
    disable = failures >= get_settings().PLANNING_FAILURE_LIMIT
    fields = {"planning_failures": failures, "last_error": error}
    if disable:
        fields["enabled"] = False
        logger.error("Disabled schedule %r after %d failures: %s", schedule.name, failures, error)
    else:
        logger.error("Could not plan schedule %r: %s", schedule.name, error)
    Schedule.objects.using(using).filter(pk=schedule.pk).update(**fields)
    return disable


def _advance_cursors(decisions: list[Decision], using: str) -> set[int]:
    """Move each cursor from its loaded value to its new one; return the ids that moved."""
    if not decisions:
        return set()
    if connections[using].vendor == "postgresql":
        return _advance_cursors_postgresql(decisions, using)
    return _advance_cursors_serialized(decisions, using)


ADVANCE_CURSORS_SQL = """
UPDATE {table} AS s SET next_fire_at = v.new_cursor, last_error = '', planning_failures = 0
FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS v (id, old_cursor, new_cursor)
WHERE s.id = v.id AND s.next_fire_at = v.old_cursor
RETURNING s.id
"""


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


def _advance_cursors_postgresql(decisions: list[Decision], using: str) -> set[int]:
    connection = connections[using]
    table = connection.ops.quote_name(Schedule._meta.db_table)
    ids = _array([d.schedule.pk for d in decisions])
    old = _array([d.schedule.next_fire_at for d in decisions])
    new = _array([d.cursor for d in decisions])
    with connection.cursor() as cursor:
        cursor.execute(ADVANCE_CURSORS_SQL.format(table=table), [ids, old, new])
        return {row[0] for row in cursor.fetchall()}


def _insert_runs(decisions: list[Decision], now: datetime, using: str) -> None:
    """Record every fire; a (schedule, plan_time) already recorded is left as it is."""
    if connections[using].vendor == "postgresql":
        return _insert_runs_postgresql(decisions, now, using)
    runs = [_fire_run(d.schedule, fire, now) for d in decisions for fire in d.fires]
    recorded = _recorded_plan_times(runs, using)
    new = [run for run in runs if (run.schedule_id, run.plan_time) not in recorded]
    # No ignore_conflicts: SQLite would then also drop a run that breaks one-active-run.
    Run.objects.using(using).bulk_create(new)


def _fire_run(schedule: Due, fire: Fire, now: datetime) -> Run:
    # Run.for_schedule's snapshot, from the columns loaded for it.
    return Run(
        schedule_id=schedule.pk,
        plan_time=fire.plan_time,
        job_name=schedule.job,
        args=schedule.args,
        kwargs=schedule.kwargs,
        max_attempts=schedule.max_attempts,
        exclusive=policies.is_exclusive(schedule.overlap),
        status=fire.status,
        error_code=fire.error_code,
        error_message=fire.error_message,
        start_deadline=_start_deadline(schedule, fire, now),
        finished_at=now if fire.status == Run.Status.SKIPPED else None,
        created_at=now,
    )


def _start_deadline(schedule: Due, fire: Fire, now: datetime) -> datetime | None:
    if fire.status != Run.Status.PENDING:
        return None
    return policies.start_deadline(schedule.misfire_grace, fire.plan_time, now)


def _recorded_plan_times(runs: list[Run], using: str) -> set[tuple[int, datetime]]:
    if not runs:
        return set()
    recorded = Run.objects.using(using).filter(
        trigger=Run.Trigger.SCHEDULE,
        schedule_id__in={run.schedule_id for run in runs},
        plan_time__in={run.plan_time for run in runs},
    )
    return set(recorded.values_list("schedule_id", "plan_time"))


# One statement for the whole batch; the snapshot of job and arguments is taken from the
# schedule rows this transaction has locked. Only a plan time already recorded is ignored:
# any other conflict (a second active run) is an error that rolls the batch back. The
# decisions (status, exclusive, start deadline) come from Python, where their rules live.
INSERT_RUNS_SQL = """
INSERT INTO {run} (
    schedule_id, plan_time, trigger, status, attempt, max_attempts, interruptions,
    exclusive, start_deadline, finished_at,
    error_code, error_message, traceback, job_name, args, kwargs, created_at
)
SELECT f.schedule_id, f.plan_time, 'schedule', f.status, 0, s.max_attempts, 0,
       f.exclusive, f.start_deadline,
       CASE WHEN f.status = 'skipped' THEN %(now)s::timestamptz END,
       f.error_code, f.error_message, '', s.job, s.args, s.kwargs, %(now)s
FROM unnest(
    %(schedule_id)s::bigint[], %(plan_time)s::timestamptz[], %(status)s::text[],
    %(error_code)s::text[], %(error_message)s::text[], %(exclusive)s::boolean[],
    %(start_deadline)s::timestamptz[]
) AS f (schedule_id, plan_time, status, error_code, error_message, exclusive, start_deadline)
JOIN {schedule} AS s ON s.id = f.schedule_id
ON CONFLICT (schedule_id, plan_time) WHERE trigger = 'schedule' DO NOTHING
"""
INSERT_COLUMNS = (
    "schedule_id",
    "plan_time",
    "status",
    "error_code",
    "error_message",
    "exclusive",
    "start_deadline",
)


def _insert_runs_postgresql(decisions: list[Decision], now: datetime, using: str) -> None:
    ids: list[int] = []
    plan_times: list[datetime] = []
    statuses: list[str] = []
    codes: list[str] = []
    messages: list[str] = []
    exclusive: list[bool] = []
    deadlines: list[datetime | None] = []
    pending = Run.Status.PENDING
    for d in decisions:
        if not d.fires:
            continue
        schedule = d.schedule
        grace, is_exclusive = schedule.misfire_grace, policies.is_exclusive(schedule.overlap)
        for fire in d.fires:
            ids.append(schedule.pk)
            plan_times.append(fire.plan_time)
            statuses.append(fire.status)
            codes.append(fire.error_code)
            messages.append(fire.error_message)
            exclusive.append(is_exclusive)
            pending_fire = fire.status == pending
            deadlines.append(
                policies.start_deadline(grace, fire.plan_time, now) if pending_fire else None
            )
    if not ids:
        return
    connection = connections[using]
    sql = INSERT_RUNS_SQL.format(
        run=connection.ops.quote_name(Run._meta.db_table),
        schedule=connection.ops.quote_name(Schedule._meta.db_table),
    )
    columns: list[list[Any]] = [ids, plan_times, statuses, codes, messages, exclusive, deadlines]
    with connection.cursor() as cursor:
        cursor.execute(
            sql, {"now": now, **dict(zip(INSERT_COLUMNS, map(_array, columns), strict=True))}
        )


def _array(values: list[Any]) -> str:
    """A PostgreSQL array literal of ints, bools, texts or aware datetimes (NULL for None).

    Sent as one text parameter and cast in SQL: adapting a list element by element costs
    more than deciding the whole batch (psycopg quotes each one in Python).
    """
    return "{" + ",".join(map(_element, values)) + "}"


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
