"""Open fires: the fires a schedule's calendars leave open, found by stretches.

Pure: no models, no database. What the calendars close is ``business_days``'s; this module
owns which fires run under them.

``OpenTrigger`` gives the fires that run: on a closed day a fire is left out
(``on_closed_day`` "skip"), or moved to the same wall time on the next or previous open day
of the calendar that closed it, at most ``MAX_SHIFT_DAYS`` away. A fire in a blackout, or
shifted into one, is not run. Fires landing on one instant are one fire.

``PlanningTrigger`` is what the planner's cursor walks: the open fires, and after each the
first closed fire before the next open one, where one skipped run stands for that closed
span (so a per-second schedule closed for a weekend records one row, not 172,800).

Both search by stretches, never fire by fire: the fires between two changes of the
calendars (a midnight of a calendar's zone, a blackout's start or end) share one fate, so
each stretch costs a few questions to the trigger however often it fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_periodic.choices import OnClosedDay
from django_periodic.timing import bounds, triggers
from django_periodic.timing.business_days import (
    MAX_SHIFT_DAYS,
    SHIFT_REACH,
    Closure,
    Closures,
    instant,
)
from django_periodic.timing.triggers import InvalidTrigger, Trigger

# The most stretches (a closed day, or the part of one between blackouts' edges) one search
# crosses before it gives up: more than one calendar within the bounds of business_days
# (MAX_CLOSED_DATES, MAX_BLACKOUTS) can close in a row (closed dates keep a week's open
# weekdays closed at most 7 * 2,001 days), so only a trigger whose own fires keep falling on
# closed days (weekly, on a closed weekday) meets it.
JUMP_LIMIT = 20_000

_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_ZERO = timedelta(0)


def closed_note(closure: Closure, on_closed_day: str) -> str:
    """A closed span's skipped run in words: what closed it, and what became of its fires."""
    if closure.blackout or on_closed_day == OnClosedDay.SKIP:
        fate = "its fires in it are not run"
    elif on_closed_day == OnClosedDay.NEXT_OPEN_DAY:
        fate = "its fires run on the next open day"
    else:
        fate = "its fires ran on the previous open day"
    return f"Closed by calendar {closure.calendar!r} ({closure.reason}): {fate}."


@dataclass(frozen=True)
class OpenTrigger(Trigger):
    """The fires of ``trigger`` that run under ``closures``: closed ones left out or shifted."""

    trigger: Trigger
    closures: Closures
    on_closed_day: str = OnClosedDay.SKIP

    def __post_init__(self) -> None:
        if self.on_closed_day not in OnClosedDay.values:
            raise InvalidTrigger(f"Unknown on_closed_day {self.on_closed_day!r}.")

    def shifted(self, fire: datetime) -> datetime | None:
        """Where a fire of the inner trigger runs: itself if open, its shift, or None."""
        closure = self.closures.closure(fire)
        if closure is None:
            return fire
        if closure.blackout or self.on_closed_day == OnClosedDay.SKIP:
            return None
        step = _DAY if self.on_closed_day == OnClosedDay.NEXT_OPEN_DAY else -_DAY
        zone = triggers.parse_timezone(closure.timezone)
        wall = fire.astimezone(zone).replace(tzinfo=None)
        for days in range(1, MAX_SHIFT_DAYS + 1):
            candidate = instant(wall + days * step, zone)
            if not bounds.EARLIEST <= candidate < bounds.LATEST:
                return None
            found = self.closures.closure(candidate)
            if found is None:
                return candidate
            if found.blackout:
                return None
        return None

    def next_after(self, after: datetime) -> datetime | None:
        low, high = self._reach()
        best: datetime | None = None
        # A fire runs at most ``high`` after its own time, so none before this one matters.
        fire = self.trigger.next_after(max(after - high, bounds.EARLIEST) - _MICROSECOND)
        for _ in range(JUMP_LIMIT):
            # Once fires run no earlier than the best found, the later ones cannot do better.
            if fire is None or (best is not None and fire + low >= best):
                return best
            _, end, shift = self._stretch(fire)
            if shift is not None:
                # The stretch's fires keep their order: the first that runs after ``after``.
                first = fire if fire + shift > after else self.trigger.next_after(after - shift)
                if first is not None and first < end:
                    best = first + shift if best is None else min(best, first + shift)
            if best is not None and end + low >= best:
                return best  # the next fire is at ``end`` at the earliest
            fire = self.trigger.next_after(end - _MICROSECOND)
        raise InvalidTrigger(_too_closed(after, "after"))

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        low, high = self._reach()
        best: datetime | None = None
        fire = self.trigger.latest_at_or_before(min(moment - low, bounds.LATEST - _MICROSECOND))
        for _ in range(JUMP_LIMIT):
            if fire is None or (best is not None and fire + high <= best):
                return best
            start, _, shift = self._stretch(fire)
            if shift is not None:
                last = (
                    fire
                    if fire + shift <= moment
                    else self.trigger.latest_at_or_before(moment - shift)
                )
                if last is not None and last >= start:
                    best = last + shift if best is None else max(best, last + shift)
            if best is not None and start - _MICROSECOND + high <= best:
                return best
            fire = self.trigger.latest_at_or_before(start - _MICROSECOND)
        raise InvalidTrigger(_too_closed(moment, "before"))

    def _reach(self) -> tuple[timedelta, timedelta]:
        """How far a fire may move: (the most it moves back, forward), as signed offsets."""
        if self.on_closed_day == OnClosedDay.NEXT_OPEN_DAY:
            return _ZERO, SHIFT_REACH
        if self.on_closed_day == OnClosedDay.PREVIOUS_OPEN_DAY:
            return -SHIFT_REACH, _ZERO
        return _ZERO, _ZERO

    def _stretch(self, fire: datetime) -> tuple[datetime, datetime, timedelta | None]:
        """The stretch [start, end) around ``fire`` whose fires share its fate, and that
        fate: each runs ``shift`` after its own time (zero: it is open), or, None, not at
        all. ``shifted()`` of any fire in it is the fire plus ``shift``."""
        start, end = self.closures.stretch(fire)
        closure = self.closures.closure(fire)
        if closure is None:
            return start, end, _ZERO
        if closure.blackout or self.on_closed_day == OnClosedDay.SKIP:
            return start, end, None
        zone = triggers.parse_timezone(closure.timezone)
        step = 1 if self.on_closed_day == OnClosedDay.NEXT_OPEN_DAY else -1
        for days in range(step, step * (MAX_SHIFT_DAYS + 1), step):
            shift = _day_shift(fire, zone, days)
            start, end = _same_shift(fire, start, end, zone, days)
            candidate = fire + shift
            if candidate < bounds.EARLIEST:
                return start, min(end, bounds.EARLIEST - shift), None
            if candidate >= bounds.LATEST:
                return max(start, bounds.LATEST - shift), end, None
            start, end = max(start, bounds.EARLIEST - shift), min(end, bounds.LATEST - shift)
            # Where the candidates cross a change of the calendars, the fates may differ.
            low, high = self.closures.stretch(candidate)
            start, end = max(start, low - shift), min(end, high - shift)
            found = self.closures.closure(candidate)
            if found is None:
                return start, end, shift
            if found.blackout:
                return start, end, None
        return start, end, None


def _too_closed(moment: datetime, where: str) -> str:
    return (
        f"No fire runs within {JUMP_LIMIT:,} closed days and blackouts {where} "
        f"{moment:%Y-%m-%d %H:%M} UTC: its calendars close every fire of its trigger."
    )


def _day_shift(fire: datetime, zone: Any, days: int) -> timedelta:
    """How far the same wall time ``days`` later (earlier if negative) in ``zone`` is."""
    wall = fire.astimezone(zone).replace(tzinfo=None)
    return instant(wall + days * _DAY, zone) - fire


def _same_shift(
    fire: datetime, start: datetime, end: datetime, zone: Any, days: int
) -> tuple[datetime, datetime]:
    """[start, end) around ``fire`` cut to where ``_day_shift`` is the fire's own.

    The shift changes only at a DST change of ``zone`` (on either day), at most once in a
    day's stretch (no zone changes its offset twice within a week), so each side is found by
    bisection.
    """
    shift = _day_shift(fire, zone, days)
    if _day_shift(end - _MICROSECOND, zone, days) != shift:
        end = _first_change(fire, end - _MICROSECOND, zone, days, shift)
    if _day_shift(start, zone, days) != shift:
        start = _first_change(fire, start, zone, days, shift) + _MICROSECOND
    return start, end


def _first_change(
    same: datetime, other: datetime, zone: Any, days: int, shift: timedelta
) -> datetime:
    """Of the instants between ``same`` (whose shift is ``shift``) and ``other`` (whose is
    not), the one nearest ``same`` whose shift is not."""
    while abs(other - same) > _MICROSECOND:
        middle = same + (other - same) // 2
        if _day_shift(middle, zone, days) == shift:
            same = middle
        else:
            other = middle
    return other


@dataclass(frozen=True)
class PlanningTrigger(Trigger):
    """What the planner's cursor walks: the open fires, and the first closed fire after
    each (if it comes before the next open one), where a skipped run stands for the span.

    Every open fire is visited once, in order, whatever instant the walk starts from: from
    an open fire, the next step is the first closed fire before the next open fire or that
    open fire; from a closed one, the next open fire.
    """

    open: OpenTrigger

    def next_after(self, after: datetime) -> datetime | None:
        following = self.open.next_after(after)
        if self.open.closures.closure(after) is not None:
            return following
        fire = self.open.trigger.next_after(after)
        if fire is None or self.open.closures.closure(fire) is None:
            return following
        return fire if following is None or fire < following else following

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        latest = self.open.latest_at_or_before(moment)
        if latest is None:
            return None
        fire = self.open.trigger.next_after(latest)
        if fire is not None and fire <= moment and self.open.closures.closure(fire) is not None:
            return fire
        return latest

    def closure(self, fire: datetime) -> Closure | None:
        """Why a fire of this walk is closed (a span's skipped run), or None if it runs."""
        return self.open.closures.closure(fire)
