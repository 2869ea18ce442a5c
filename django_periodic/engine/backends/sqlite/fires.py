"""Planning recorded through the ORM: cursors moved, then the runs of the schedules whose
cursor moved inserted (``planning/recording.py`` owns recording, and works out what each
run holds); and a backfill's runs."""

from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Max

from django_periodic import choices
from django_periodic.engine import records
from django_periodic.engine.records import Decision, Due, FireRow, PlannedRow, Recorded
from django_periodic.models import Run, Schedule, limits
from django_periodic.models.run import (
    AWAITING_RELEASE,
    finished_when_recorded,
    taken_from_schedule,
)


def _advance_cursors_serialized(decisions: list[Recorded], using: str) -> set[int]:
    # SQLite runs one write transaction at a time (BEGIN IMMEDIATE), so the rows we read
    # cannot have changed under us; executemany of a prepared UPDATE is its fastest form.
    connection = connections[using]
    table = connection.ops.quote_name(Schedule._meta.db_table)
    sql = (
        f"UPDATE {table} SET next_fire_at = %s, fire_count = fire_count + %s, last_error = '',"
        " planning_failures = 0 WHERE id = %s"
    )
    params = [
        (_db_datetime(r.decision.cursor, connection), r.counted, r.decision.schedule.pk)
        for r in decisions
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
    return {r.decision.schedule.pk for r in decisions}


def _db_datetime(value: datetime | None, connection: BaseDatabaseWrapper) -> Any:
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def _insert_runs(decisions: list[Recorded], now: datetime, using: str) -> list[Run]:
    """Record every fire; a (schedule, scope, plan_time) already recorded is left as it is.
    Returns the runs inserted."""
    runs = [_fire_run(r.decision.schedule, row, now) for r in decisions for row in r.fires]
    recorded = _recorded_plan_times(runs, using)
    new = [run for run in runs if (run.schedule_id, run.scope, run.plan_time) not in recorded]
    # No ignore_conflicts: SQLite would then also drop a run that breaks one-active-run.
    return Run.objects.using(using).bulk_create(new)


def insert_new_runs(runs: list[Run], using: str) -> list[PlannedRow]:
    # SQLite runs one write transaction at a time (BEGIN IMMEDIATE): no run can be recorded
    # between the read of those recorded and the insert.
    with transaction.atomic(using=using):
        recorded = _recorded_plan_times(runs, using)
        new = [run for run in runs if (run.schedule_id, run.scope, run.plan_time) not in recorded]
        inserted = Run.objects.using(using).bulk_create(new)
    return [(r.pk, r.schedule_id, r.scope, r.plan_time, r.status, r.error_code) for r in inserted]


def _fire_run(schedule: Due, row: FireRow, now: datetime) -> Run:
    # Run.for_schedule, from the columns loaded for it.
    fire, release, start_deadline, finish_by = row
    fields = {
        **taken_from_schedule(schedule),
        "release_at": release,
        "status": fire.status,
    }
    return Run(
        schedule_id=schedule.pk,
        scope=fire.scope,
        plan_time=fire.plan_time,
        **limits.hold(fields),
        error_code=fire.error_code,
        error_message=fire.error_message,
        start_deadline=start_deadline,
        finish_by=finish_by,
        finished_at=finished_when_recorded(fire.status, now),
        created_at=now,
    )


def _recorded_plan_times(runs: list[Run], using: str) -> set[tuple[int, str, datetime]]:
    if not runs:
        return set()
    recorded = Run.objects.using(using).filter(
        trigger__in=choices.LEDGER_TRIGGERS,
        schedule_id__in={run.schedule_id for run in runs},
        plan_time__in={run.plan_time for run in runs},
    )
    return set(recorded.values_list("schedule_id", "scope", "plan_time"))


def record_fires(
    decisions: list[Recorded], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    """Move the cursors, insert the runs; return the decisions applied."""
    advanced = _advance_cursors_serialized(decisions, using)
    planned = [r for r in decisions if r.decision.schedule.pk in advanced]
    new = _insert_runs(planned, now, using)
    if inserted is not None:
        inserted += [
            (r.pk, r.schedule_id, r.scope, r.plan_time, r.status, r.error_code) for r in new
        ]
    return [r.decision for r in planned]


def _first_release(schedule: Schedule, now: datetime, spacing: timedelta, using: str) -> datetime:
    """After the schedule's last backfilled run still waiting for its release, or now."""
    waiting = Run.objects.using(using).filter(AWAITING_RELEASE, schedule=schedule)
    last = waiting.aggregate(at=Max("next_retry_at"))["at"]
    return now if last is None else max(now, last + spacing)


def insert_backfill(
    schedule: Schedule, in_range: records.InRange, now: datetime, spacing: timedelta, using: str
) -> list[records.BackfilledRow]:
    # SQLite runs one write transaction at a time (transaction_mode IMMEDIATE, see checks),
    # so what this transaction reads cannot change before it writes.
    with transaction.atomic(using=using):
        recorded_ = recorded(schedule, in_range, using)
        release = _first_release(schedule, now, spacing, using)
        runs = []
        for plan_time in in_range.times:
            for scope in in_range.scopes:
                if (scope, plan_time) in recorded_:
                    continue
                runs.append(_run(schedule, in_range, plan_time, scope, release, now))
                release += spacing
        Run.objects.using(using).bulk_create(runs)
    return [(run.pk, run.scope, run.plan_time, _release_of(run)) for run in runs]


def _release_of(run: Run) -> datetime:
    assert run.next_retry_at is not None  # set by _run()
    return run.next_retry_at


def recorded(
    schedule: Schedule, in_range: records.InRange, using: str
) -> set[tuple[str, datetime]]:
    """The in_range (scope, plan time) pairs that have a run of any trigger."""
    runs = Run.objects.using(using).filter(
        schedule=schedule, plan_time__gte=in_range.start, plan_time__lt=in_range.end
    )
    pairs = {(scope, plan_time) for plan_time in in_range.times for scope in in_range.scopes}
    return pairs & set(runs.values_list("scope", "plan_time"))


def _run(
    schedule: Schedule,
    in_range: records.InRange,
    plan_time: datetime,
    scope: str,
    release: datetime,
    now: datetime,
) -> Run:
    return Run(
        schedule=schedule,
        plan_time=plan_time,
        scope=scope,
        next_retry_at=release,
        created_at=now,
        **in_range.run_fields,
    )


# What planning loads of a due schedule besides planner.DECISION_FIELDS, for _fire_run to
# copy into each run: the schedule's side of run.SNAPSHOT_FIELDS, with max_attempts and
# tasks_backend, in Due's order. PostgreSQL's statement copies them itself (none).
SNAPSHOT_COLUMNS_LOADED: tuple[str, ...] = (
    "args",
    "kwargs",
    "max_attempts",
    "tasks_backend",
    "revision",
    "concurrency_limit_id",
)
