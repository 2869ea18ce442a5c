"""Planning: due schedules become runs, exactly once per plan time.

One tick locks a batch of due schedules (skipping rows another planner holds), decides
in Python what each fires, advances every cursor by compare-and-set and inserts the runs,
all in one transaction and a constant number of queries however many schedules are due.

Deciding costs Python time per schedule, so a batch reads only the columns a decision needs
and computes each distinct trigger's fire times once: many schedules sharing a trigger and a
cursor (100,000 on the same cron) cost one ``next_after``, not one each.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, F, Q, When

from django_periodic import policies, registry, triggers
from django_periodic.conf import get_settings
from django_periodic.models import Run, Schedule
from django_periodic.policies import Occupancy

logger = logging.getLogger("django_periodic")


@dataclass(frozen=True)
class Fire:
    """A run to record for a plan time: pending, queued or skipped (with why)."""

    plan_time: datetime
    status: str
    error_code: str = ""
    error_message: str = ""


@dataclass(slots=True)
class Due:
    """The columns of a locked due schedule that planning reads (a ``policies.Policy``)."""

    pk: int
    name: str
    job: str
    cron: str
    timezone: str
    interval: timedelta | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    created_at: datetime | None  # only where it anchors an interval (else not loaded)
    next_fire_at: datetime | None
    overlap: str
    max_queued: int
    max_concurrent: int | None
    misfire: str
    misfire_grace: timedelta
    planning_failures: int
    # The runs' snapshot; on PostgreSQL the INSERT takes it from the locked rows instead.
    args: Any = None
    kwargs: Any = None
    max_attempts: int = 1

    def trigger_key(self) -> tuple[Any, ...]:
        """What ``Schedule.trigger`` depends on: equal keys, equal triggers."""
        # An interval without start_at is anchored at created_at: only then is it part of it.
        anchored = not self.cron and self.interval is not None and self.start_at is None
        anchor = self.created_at if anchored else None
        return (
            self.cron,
            self.timezone,
            self.interval,
            self.run_at,
            self.start_at,
            self.end_at,
            anchor,
        )

    def trigger(self) -> triggers.Trigger:
        """The schedule's trigger, built by the model's own rules."""
        fields = ("cron", "timezone", "interval", "run_at", "start_at", "end_at", "created_at")
        return Schedule(**{name: getattr(self, name) for name in fields}).trigger


DECISION_FIELDS = (
    "pk", "name", "job", "cron", "timezone", "interval", "run_at", "start_at", "end_at",
    "anchor", "next_fire_at", "overlap", "max_queued", "max_concurrent", "misfire",
    "misfire_grace", "planning_failures",
)  # fmt: skip
SNAPSHOT_FIELDS = ("args", "kwargs", "max_attempts")


@dataclass(slots=True)
class Decision:
    """What one schedule does this tick: the runs to record and where its cursor moves."""

    schedule: Due
    cursor: datetime | None
    fires: tuple[Fire, ...] = ()
    supersedes_retry: bool = False
    error: str = ""


@dataclass
class PlanResult:
    schedules: int = 0
    fired: int = 0
    late: int = 0  # of the fired, those past their misfire grace (fired by policy)
    skipped: int = 0
    failed: list[str] = field(default_factory=list)  # schedules that could not be planned
    disabled: list[str] = field(default_factory=list)  # ...and were disabled for it
    deferred: int = 0  # not planned ahead: a run was in flight

    def __add__(self, other: "PlanResult") -> "PlanResult":
        """Two batches' results as one (for a tick of several batches)."""
        return PlanResult(
            self.schedules + other.schedules,
            self.fired + other.fired,
            self.late + other.late,
            self.skipped + other.skipped,
            self.failed + other.failed,
            self.disabled + other.disabled,
            self.deferred + other.deferred,
        )


@dataclass
class DueTimes:
    times: list[datetime]  # plan times up to now, in order: at most CATCHUP_LIMIT + 2
    cursor: datetime | None  # the first fire after now
    unlisted: datetime | None = None  # the first of the missed times not listed one by one


def plan_due(
    now: datetime,
    *,
    using: str = "default",
    batch_size: int | None = None,
    ahead: timedelta = timedelta(0),
) -> PlanResult:
    """Turn every fire due at ``now`` of one batch of schedules into runs.

    With ``ahead``, a schedule whose next fire comes within ``ahead`` of ``now`` and that has
    nothing in flight is planned already (pending, for that plan time), so that it can be
    claimed and start on time. One with a run in flight is left to be planned when due:
    its overlap policy must decide on what is in flight then.
    """
    batch_size = batch_size or get_settings().PLAN_BATCH_SIZE
    fields: tuple[str, ...] = DECISION_FIELDS
    if connections[using].vendor != "postgresql":
        fields += SNAPSHOT_FIELDS
    with transaction.atomic(using=using):
        due = Schedule.objects.using(using).due(now + ahead).select_for_update(skip_locked=True)
        # Loading a timestamp costs microseconds: created_at only where it anchors an interval.
        anchored = Q(cron="", interval__isnull=False, start_at__isnull=True)
        due = due.annotate(anchor=Case(When(anchored, then=F("created_at"))))
        schedules = [Due(*row) for row in due.values_list(*fields)[:batch_size]]
        if not schedules:
            return PlanResult()
        occupancy = Run.objects.using(using).occupancy([s.pk for s in schedules])
        decisions = decide_all(schedules, now, occupancy)
        result = _apply(decisions, now, using)
        result.deferred = len(schedules) - len(decisions)
        return result


def decide_all(
    schedules: list[Due], now: datetime, occupancy: dict[int, Occupancy]
) -> list[Decision]:
    """Decide a batch; each distinct trigger's due times are computed once (no database access).

    A schedule with nothing in flight decides by its trigger, cursor and policy alone, so
    schedules alike in those share one decision's fires. A schedule not due yet (planned
    ahead) decides as at its next fire, and only with nothing in flight; else it waits.
    """
    memo = _Memo()
    decisions = []
    for schedule in schedules:
        in_flight = occupancy.get(schedule.pk)
        ahead = schedule.next_fire_at is not None and schedule.next_fire_at > now
        if ahead and in_flight is not None:
            continue  # decided when due, on what is in flight then
        if in_flight is not None:
            decisions.append(decide(schedule, now, in_flight, memo))
            continue
        key = (
            schedule.trigger_key(), schedule.next_fire_at, schedule.job, schedule.misfire,
            schedule.misfire_grace, schedule.overlap, schedule.max_concurrent, schedule.max_queued,
        )  # fmt: skip
        shared = memo.decisions.get(key)
        if shared is None:
            at = schedule.next_fire_at if ahead else now
            assert at is not None  # a due schedule has a cursor
            shared = memo.decisions[key] = decide(schedule, at, Occupancy(), memo)
        decisions.append(Decision(schedule, shared.cursor, shared.fires, False, shared.error))
    return decisions


class _Memo:
    """What one batch has computed already, by the values it depends on."""

    def __init__(self) -> None:
        self.limit = get_settings().CATCHUP_LIMIT
        self.jobs: dict[str, str] = {}  # job name -> error ("" if registered)
        self.triggers: dict[tuple[Any, ...], triggers.Trigger | str] = {}  # -> trigger or error
        self.due: dict[tuple[Any, ...], DueTimes | str] = {}  # (trigger, cursor, now) -> ...
        self.decisions: dict[tuple[Any, ...], Decision] = {}

    def due_times(self, schedule: Due, now: datetime) -> DueTimes:
        """The schedule's due times; raises (a bad row) as computing them would."""
        error = self.jobs.get(schedule.job)
        if error is None:
            error = self.jobs[schedule.job] = _error(registry.get_job, schedule.job)
        if error:
            raise _Failed(error)
        key = schedule.trigger_key()
        trigger = self.triggers.get(key)
        if trigger is None:
            try:
                trigger = schedule.trigger()
            except Exception as exc:
                trigger = f"Cannot plan: {exc}"
            self.triggers[key] = trigger
        if isinstance(trigger, str):
            raise _Failed(trigger)
        due = self.due.get((key, schedule.next_fire_at, now))
        if due is None:
            try:
                due = _due_times(trigger, schedule.next_fire_at, now, self.limit)
            except Exception as exc:
                due = f"Cannot plan: {exc}"
            self.due[key, schedule.next_fire_at, now] = due
        if isinstance(due, str):
            raise _Failed(due)
        return due


class _Failed(Exception):
    """A bad row, with the message to record (already prefixed)."""


def _error(check: Any, *args: Any) -> str:
    try:
        check(*args)
    except Exception as exc:
        return f"Cannot plan: {exc}"
    return ""


def decide(
    schedule: Due, now: datetime, occupancy: Occupancy, memo: "_Memo | None" = None
) -> Decision:
    """The runs a due schedule records at ``now`` and its next cursor (no database access)."""
    memo = memo or _Memo()
    try:
        due = memo.due_times(schedule, now)
    except _Failed as exc:  # any bad row: one schedule fails, never the tick
        return Decision(schedule, cursor=None, error=str(exc))
    fires = []
    status: str
    for plan_time, missed in policies.misfire_marks(schedule, due.times, now, memo.limit):
        if missed:
            status, reason = Run.Status.SKIPPED, policies.SKIPPED_MISSED
        else:
            status, reason = policies.overlap_status(schedule, occupancy)
        fires.append(Fire(plan_time, status, reason))
    if due.unlisted:
        latest = due.times[-1]
        message = f"Missed, as was every plan time after it up to {latest:%Y-%m-%d %H:%M:%S}."
        reason = policies.SKIPPED_MISSED
        fires.append(Fire(due.unlisted, Run.Status.SKIPPED, reason, message))
    fired = any(fire.status != Run.Status.SKIPPED for fire in fires)
    return Decision(schedule, due.cursor, tuple(fires), occupancy.retrying and fired)


def _due_times(
    trigger: triggers.Trigger, cursor: datetime | None, now: datetime, limit: int
) -> DueTimes:
    due: list[datetime] = []
    fire = cursor
    while fire is not None and fire <= now and len(due) <= limit:
        due.append(fire)
        fire = trigger.next_after(fire)
    if fire is None or fire > now:
        return DueTimes(due, fire)
    # More missed times than we list one by one: one row stands for those in between,
    # and the most recent is listed so that the misfire policy can fire it.
    latest = trigger.latest_at_or_before(now)
    assert latest is not None  # fire is a fire time at or before now
    if latest == fire:
        return DueTimes([*due, latest], trigger.next_after(now))
    return DueTimes([*due, latest], trigger.next_after(now), unlisted=fire)


def _apply(decisions: list[Decision], now: datetime, using: str) -> PlanResult:
    result = PlanResult(schedules=len(decisions))
    failed = [d for d in decisions if d.error]
    planned = [d for d in decisions if not d.error]
    try:
        with transaction.atomic(using=using):
            planned = _record(planned, now, using)
    except DatabaseError:
        # One row the database refuses must not stop the others: retry one by one.
        logger.exception("Planning a batch failed; planning its schedules one at a time.")
        planned, failed = _record_one_by_one(planned, now, using, failed)
    for decision in failed:
        if _record_failure(decision.schedule, decision.error, using):
            result.disabled.append(decision.schedule.name)
        result.failed.append(decision.schedule.name)
    fires = [(d.schedule, fire) for d in planned for fire in d.fires]
    result.skipped = sum(fire.status == Run.Status.SKIPPED for _, fire in fires)
    result.fired = len(fires) - result.skipped
    result.late = sum(
        fire.status != Run.Status.SKIPPED and fire.plan_time < now - schedule.misfire_grace
        for schedule, fire in fires
    )
    return result


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
    decisions: list[Decision], now: datetime, using: str, failed: list[Decision]
) -> tuple[list[Decision], list[Decision]]:
    planned = []
    for decision in decisions:
        try:
            with transaction.atomic(using=using):
                planned += _record([decision], now, using)
        except DatabaseError as exc:
            decision.error = f"Cannot plan: {exc}"
            failed = [*failed, decision]
    return planned, failed


def _record_failure(schedule: Due, error: str, using: str) -> bool:
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


def plan_retry(failed: Run, now: datetime) -> Run:
    """Record a new run that repeats ``failed`` (same plan time, job and arguments)."""
    snapshot = {"job_name": failed.job_name, "args": failed.args, "kwargs": failed.kwargs}
    return failed.schedule.plan_extra_run(
        now, trigger=Run.Trigger.RETRY, plan_time=failed.plan_time, **snapshot
    )
