"""Backfill: record a schedule's missed plan times over a past range, released at a rate.

A backfilled run is a ledger entry like a scheduled fire (trigger ``backfill``): the
database's unique (schedule, scope, plan time) constraint keeps two backfills, or a
backfill and the planner, from recording one plan time twice. Plan times with a run of any
trigger are left alone, and the schedule's cursor does not move.

So as not to flood the workers, runs wait as retries do (status ``retrying``, attempt 0)
until their release time, ``next_retry_at``, spaced ``1 / rate`` seconds apart after the
schedule's last waiting backfilled run. The claim path, the wake-ups and the hand-off to a
tasks backend that serve retries then start them: there is no loop of its own, and a
scheduler that dies mid-backfill loses nothing (they are rows).
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Max

from django_periodic import scopes as scope_providers
from django_periodic import signals
from django_periodic.db import clock
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.loop import wakeups
from django_periodic.models import (
    AWAITING_RELEASE,
    Run,
    Schedule,
    closures_of,
    open_trigger_of,
)
from django_periodic.models.run import AWAITING_RELEASE_VALUES, taken_from_schedule

#: Runs released per second per schedule, unless a call says otherwise.
DEFAULT_RATE = 1.0
#: Most runs one call may record (plan times times scope keys): more is a mistake (a minute
#: cron over a year), or a job for several calls.
MAX_RUNS = 1000


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill recorded over ``[start, end)`` (``end`` clamped to the database's
    clock): ``recorded`` new runs, ``existing`` plan times already in the ledger."""

    start: datetime
    end: datetime
    recorded: int
    existing: int
    first_release: datetime | None = None
    last_release: datetime | None = None

    @property
    def plan_times(self) -> int:
        """The runs the range holds: recorded now or before."""
        return self.recorded + self.existing


# A run inserted: its id, scope, plan time and release time.
BackfilledRow = tuple[int, str, datetime, datetime]


@dataclass(frozen=True)
class _Range:
    start: datetime
    end: datetime
    times: list[datetime]
    scopes: list[str]

    @property
    def count(self) -> int:
        return len(self.times) * len(self.scopes)


def backfill(
    schedule: Schedule,
    start: datetime,
    end: datetime,
    *,
    rate: float = DEFAULT_RATE,
    now: datetime | None = None,
) -> BackfillResult:
    """Record a run for each plan time of ``schedule`` in ``[start, end)`` that has none.

    See ``Schedule.backfill()``.
    """
    using = schedule._state.db or "default"
    spacing = _spacing(rate)
    now = now or clock.now(using)
    in_range = _in_range(schedule, start, end, now)
    if not in_range.count:
        return BackfillResult(in_range.start, in_range.end, 0, 0)
    if connections[using].vendor == "postgresql":
        inserted = _insert_postgresql(schedule, in_range, now, spacing, using)
    else:
        inserted = _insert_orm(schedule, in_range, now, spacing, using)
    if inserted:
        wakeups.notify(using)
    if signals.listened(signals.run_planned):
        signals.send_on_commit(_planned_events(schedule, inserted, using), using)
    releases = [release for _, _, _, release in inserted]
    return BackfillResult(
        in_range.start,
        in_range.end,
        recorded=len(releases),
        existing=in_range.count - len(releases),
        first_release=min(releases, default=None),
        last_release=max(releases, default=None),
    )


def preview(schedule: Schedule, start: datetime, end: datetime, now: datetime) -> BackfillResult:
    """What ``backfill()`` would record now, without recording it (releases not set)."""
    in_range = _in_range(schedule, start, end, now)
    using = schedule._state.db or "default"
    existing = len(_recorded(schedule, in_range, using))
    return BackfillResult(in_range.start, in_range.end, in_range.count - existing, existing)


def _planned_events(
    schedule: Schedule, inserted: list[BackfilledRow], using: str
) -> list[signals.Event]:
    return [
        signals.run_event(
            signals.run_planned,
            run_id=run_id,
            schedule_id=schedule.pk,
            schedule=schedule.name,
            scope=scope,
            plan_time=plan_time,
            attempt=int(AWAITING_RELEASE_VALUES["attempt"]),
            status=str(AWAITING_RELEASE_VALUES["status"]),
            using=using,
        )
        for run_id, scope, plan_time, _ in inserted
    ]


def _spacing(rate: float) -> timedelta:
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of runs per second, not {rate!r}.")
    return timedelta(seconds=1 / rate)


class RangeError(ValueError):
    """A range no backfill covers; ``field`` names the bound at fault ("start" or "end")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def checked_range(start: datetime, end: datetime, now: datetime) -> tuple[datetime, datetime]:
    """The range a backfill covers: ``[start, end)`` with ``end`` clamped to ``now`` (only
    past plan times). The rule of the API and of the admin's form alike.

    Raises RangeError for naive times, an empty range or a start in the future.
    """
    if start.tzinfo is None or end.tzinfo is None:
        naive = "start" if start.tzinfo is None else "end"
        raise RangeError(naive, "start and end must be aware datetimes.")
    if start >= end:
        raise RangeError("end", f"start ({start}) must come before end ({end}).")
    if start > now:
        message = f"start ({start}) is in the future (now: {now}): only past plan times backfill."
        raise RangeError("start", message)
    return start, min(end, now)


def _in_range(schedule: Schedule, start: datetime, end: datetime, now: datetime) -> _Range:
    """The plan times to backfill and the scope keys of each, within the limit."""
    start, end = checked_range(start, end, now)
    keys = scope_providers.scope_keys(schedule.scopes) if schedule.scopes else [""]
    most = MAX_RUNS // max(len(keys), 1)
    times = _plan_times(schedule, start, end, most)
    if len(times) > most:
        per_time = f" ({len(keys)} scope keys per plan time)" if schedule.scopes else ""
        raise ValueError(
            f"More than {MAX_RUNS} runs to backfill from {start} to {end}{per_time}: the "
            f"limit per call is {MAX_RUNS}; backfill a shorter range at a time."
        )
    return _Range(start, end, times, keys)


def _plan_times(schedule: Schedule, start: datetime, end: datetime, most: int) -> list[datetime]:
    """The plan times in ``[start, end)`` of the fires that run (its calendars' closed fires
    left out or shifted, as the planner would have), at most ``most + 1`` of them."""
    trigger = open_trigger_of(schedule, closures_of(schedule))
    times: list[datetime] = []
    after = start - timedelta(microseconds=1)
    while len(times) <= most and (fire := trigger.next_after(after)) is not None and fire < end:
        times.append(fire)
        after = fire
    return times


def _recorded(schedule: Schedule, in_range: _Range, using: str) -> set[tuple[str, datetime]]:
    """The in_range (scope, plan time) pairs that have a run of any trigger."""
    runs = Run.objects.using(using).filter(
        schedule=schedule, plan_time__gte=in_range.start, plan_time__lt=in_range.end
    )
    pairs = {(scope, plan_time) for plan_time in in_range.times for scope in in_range.scopes}
    return pairs & set(runs.values_list("scope", "plan_time"))


def _first_release(schedule: Schedule, now: datetime, spacing: timedelta, using: str) -> datetime:
    """After the schedule's last backfilled run still waiting for its release, or now."""
    waiting = Run.objects.using(using).filter(AWAITING_RELEASE, schedule=schedule)
    last = waiting.aggregate(at=Max("next_retry_at"))["at"]
    return now if last is None else max(now, last + spacing)


def _insert_orm(
    schedule: Schedule, in_range: _Range, now: datetime, spacing: timedelta, using: str
) -> list[BackfilledRow]:
    # SQLite runs one write transaction at a time (transaction_mode IMMEDIATE, see checks),
    # so what this transaction reads cannot change before it writes.
    with transaction.atomic(using=using):
        recorded = _recorded(schedule, in_range, using)
        release = _first_release(schedule, now, spacing, using)
        runs = []
        for plan_time in in_range.times:
            for scope in in_range.scopes:
                if (scope, plan_time) in recorded:
                    continue
                runs.append(_run(schedule, plan_time, scope, release, now))
                release += spacing
        Run.objects.using(using).bulk_create(runs)
    return [(run.pk, run.scope, run.plan_time, _release_of(run)) for run in runs]


def _release_of(run: Run) -> datetime:
    assert run.next_retry_at is not None  # set by _run()
    return run.next_retry_at


# A backfilled run awaits its release, and is released by rate, not by the schedule's slot
# (see docs/backfill.md): what it has of its own over what it takes from its schedule.
BACKFILLED: dict[str, Any] = {**AWAITING_RELEASE_VALUES, "exclusive": False}


def _new_run_fields(schedule: Schedule) -> dict[str, Any]:
    """The fields every run of one backfill of ``schedule`` has alike."""
    return {**taken_from_schedule(schedule), **BACKFILLED}


def _run(
    schedule: Schedule, plan_time: datetime, scope: str, release: datetime, now: datetime
) -> Run:
    fields = _new_run_fields(schedule)
    return Run(
        schedule=schedule,
        plan_time=plan_time,
        scope=scope,
        next_retry_at=release,
        created_at=now,
        **fields,
    )


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


def _insert_postgresql(
    schedule: Schedule, in_range: _Range, now: datetime, spacing: timedelta, using: str
) -> list[BackfilledRow]:
    connection = connections[using]
    quote = connection.ops.quote_name
    awaiting, awaiting_params = rules.condition(Run.objects.filter(AWAITING_RELEASE), "awaiting")
    fields = {field.name: field for field in Run._meta.concrete_fields}
    new = _new_run_fields(schedule)
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
