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

from django_periodic import scopes as scope_providers
from django_periodic import signals
from django_periodic.db import announcements, clock
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import BackfilledRow, InRange
from django_periodic.models import Schedule, limits
from django_periodic.models.calendars import closures_of
from django_periodic.models.run import (
    AWAITING_RELEASE_VALUES,
    taken_from_schedule,
)
from django_periodic.models.trigger_rows import open_trigger_of

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


def backfill(
    schedule: Schedule,
    start: datetime,
    end: datetime,
    *,
    rate: float | None = None,
    now: datetime | None = None,
) -> BackfillResult:
    """Record a run for each plan time of ``schedule`` in ``[start, end)`` that has none.

    See ``Schedule.backfill()``.
    """
    using = schedule._state.db or "default"
    spacing = _spacing(DEFAULT_RATE if rate is None else rate)
    now = now or clock.now(using)
    in_range = _in_range(schedule, start, end, now)
    if not in_range.count:
        return BackfillResult(in_range.start, in_range.end, 0, 0)
    inserted = ledger(using).insert_backfill(schedule, in_range, now, spacing)
    if inserted:
        announcements.notify(using)
    if signals.listened(signals.run_planned):
        announcements.send_on_commit(_planned_events(schedule, inserted, using), using)
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
    existing = len(ledger(using).recorded(schedule, in_range))
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


def _in_range(schedule: Schedule, start: datetime, end: datetime, now: datetime) -> InRange:
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
    return InRange(start, end, times, keys, new_run_fields(schedule))


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


# A backfilled run awaits its release, and is released by rate, not by the schedule's slot
# (see docs/backfill.md): what it has of its own over what it takes from its schedule.
BACKFILLED: dict[str, Any] = {**AWAITING_RELEASE_VALUES, "exclusive": False}


def new_run_fields(schedule: Schedule) -> dict[str, Any]:
    """The fields every run of one backfill of ``schedule`` has alike."""
    return limits.hold({**taken_from_schedule(schedule), **BACKFILLED})
