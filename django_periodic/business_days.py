"""Business days: which fires a schedule's calendars close, and where a shifted one goes.

Pure: no models, no database. A calendar (``CalendarRules``) closes whole days on its own
wall clock (closed weekdays, closed dates, public holidays from the optional ``holidays``
package) and blackout periods (instants, half-open ``[start, end)``). A schedule's calendars
(``Closures``) close a fire when any of them does.

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

import bisect
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django_periodic import bounds, triggers
from django_periodic.choices import OnClosedDay
from django_periodic.triggers import InvalidTrigger, Trigger

# The farthest a fire is shifted; a fire with no open day that near is not run.
MAX_SHIFT_DAYS = 7
# The most closed dates, and blackouts, a calendar holds (docs/calendars.md).
MAX_CLOSED_DATES = 2_000
MAX_BLACKOUTS = 2_000
# The most stretches (a closed day, or the part of one between blackouts' edges) one search
# crosses before it gives up: more than one calendar within the bounds above can close in a
# row (closed dates keep a week's open weekdays closed at most 7 * 2,001 days), so only a
# trigger whose own fires keep falling on closed days (weekly, on a closed weekday) meets it.
JUMP_LIMIT = 20_000

_SPAN = timedelta(days=MAX_SHIFT_DAYS + 1)  # a shift's reach, with room for DST changes
_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_ZERO = timedelta(0)
# Before and after any instant a trigger fires at, so that a stretch's ends stay datetimes.
_FAR_PAST = bounds.EARLIEST - 2 * _SPAN
_FAR_FUTURE = bounds.LATEST + 2 * _SPAN
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
HOLIDAYS_MISSING = (
    "public holidays need the holidays package: pip install django-periodic[holidays]"
)
BLACKOUT_REASON_MAX_LENGTH = 200


@dataclass(frozen=True)
class Blackout:
    """A period, ``[start, end)``, in which no fire runs (a release freeze, say)."""

    start: datetime
    end: datetime
    reason: str = ""


@dataclass(frozen=True)
class Closure:
    """Why a fire does not run at its time: the calendar, the reason, and the span closed."""

    calendar: str
    reason: str
    timezone: str
    start: datetime
    end: datetime
    blackout: bool = False

    def __str__(self) -> str:
        return f"{self.calendar}: {self.reason}"


@dataclass(frozen=True)
class _BlackoutIndex:
    """Blackouts sorted once, for lookups by bisection: ``starts`` and the running maximum
    of their ends (so the first whose end is after an instant is found by bisection too),
    and every start and end, where what a calendar closes can change."""

    blackouts: tuple[Blackout, ...]
    starts: tuple[datetime, ...]
    reach: tuple[datetime, ...]
    edges: tuple[datetime, ...]

    @classmethod
    def of(cls, blackouts: Iterable[Blackout]) -> _BlackoutIndex:
        ordered = tuple(sorted(blackouts, key=lambda b: (b.start, b.end, b.reason)))
        reach: list[datetime] = []
        for blackout in ordered:
            reach.append(max(reach[-1], blackout.end) if reach else blackout.end)
        edges = sorted({moment for b in ordered for moment in (b.start, b.end)})
        return cls(ordered, tuple(b.start for b in ordered), tuple(reach), tuple(edges))

    def holding(self, moment: datetime) -> Blackout | None:
        """The blackout holding ``moment`` that starts first (then ends first), or None."""
        # The first whose end is after moment; one before it ended by then, and one after it
        # starts no earlier, so if this one has not started, none holding moment has.
        index = bisect.bisect_right(self.reach, moment)
        if index < len(self.blackouts) and self.starts[index] <= moment:
            return self.blackouts[index]
        return None

    def stretch(self, moment: datetime) -> tuple[datetime, datetime]:
        """The edges around ``moment``, [start, end): no blackout starts or ends inside."""
        index = bisect.bisect_right(self.edges, moment)
        start = self.edges[index - 1] if index else _FAR_PAST
        return start, self.edges[index] if index < len(self.edges) else _FAR_FUTURE


@dataclass(frozen=True)
class CalendarRules:
    """One calendar's closed days and blackouts (``CalendarRules.parse`` checks a row's)."""

    name: str
    timezone: str
    holidays_country: str = ""
    holidays_subdivision: str = ""
    closed_weekdays: frozenset[int] = frozenset()  # 0 = Monday, as date.weekday()
    closed_dates: frozenset[date] = frozenset()
    blackouts: tuple[Blackout, ...] = ()
    _index: _BlackoutIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", _BlackoutIndex.of(self.blackouts))

    @classmethod
    def parse(
        cls,
        name: str,
        timezone: str,
        holidays_country: str,
        holidays_subdivision: str,
        closed_weekdays: Any,
        closed_dates: Any,
        blackouts: Any,
    ) -> CalendarRules:
        """A calendar's stored values as rules; raises InvalidTrigger naming what is wrong."""
        errors = calendar_errors(
            timezone,
            holidays_country,
            holidays_subdivision,
            closed_weekdays,
            closed_dates,
            blackouts,
        )
        if errors:
            messages = " ".join(message for _, message in errors)
            raise InvalidTrigger(f"Calendar {name!r}: {messages}")
        return cls(
            name,
            timezone,
            holidays_country,
            holidays_subdivision,
            frozenset(closed_weekdays),
            frozenset(date.fromisoformat(day) for day in closed_dates),
            tuple(_blackout(value) for value in blackouts),
        )

    def day_reason(self, day: date) -> str | None:
        """Why this calendar closes ``day`` (on its own wall clock), or None if it is open."""
        if day in self.closed_dates:
            return f"closed on {day:%Y-%m-%d}"
        if day.weekday() in self.closed_weekdays:
            return f"closed on {WEEKDAYS[day.weekday()]}s"
        if self.holidays_country:
            return holiday_name(self.holidays_country, self.holidays_subdivision, day)
        return None

    def day_closure(self, moment: datetime) -> Closure | None:
        """Why this calendar closes the day of ``moment`` (on its wall clock), or None."""
        reason = self.day_reason(moment.astimezone(triggers.parse_timezone(self.timezone)).date())
        if reason is None:
            return None
        start, end = self.day_stretch(moment)
        return Closure(self.name, reason, self.timezone, start, end)

    def day_stretch(self, moment: datetime) -> tuple[datetime, datetime]:
        """The day of ``moment`` on this calendar's wall clock, as instants [start, end)."""
        zone = triggers.parse_timezone(self.timezone)
        day = moment.astimezone(zone).date()
        start = min(_instant(datetime.combine(day, time()), zone), moment)
        end = max(_instant(datetime.combine(day + _DAY, time()), zone), moment + _MICROSECOND)
        return start, end

    def blackout_closure(self, moment: datetime) -> Closure | None:
        """The blackout of this calendar that ``moment`` is in, or None; of overlapping
        ones, the one that starts first. Found by bisection, however many there are."""
        blackout = self._index.holding(moment)
        if blackout is None:
            return None
        why = f"blackout until {blackout.end:%Y-%m-%d %H:%M} UTC"
        reason = f"{why}: {blackout.reason}" if blackout.reason else why
        return Closure(
            self.name, reason, self.timezone, blackout.start, blackout.end, blackout=True
        )

    def stretch(self, moment: datetime) -> tuple[datetime, datetime]:
        """The instants around ``moment``, [start, end), on which this calendar closes
        alike: one of its days, cut where a blackout starts or ends."""
        day_start, day_end = self.day_stretch(moment)
        start, end = self._index.stretch(moment)
        return max(start, day_start), min(end, day_end)


@dataclass(frozen=True)
class Closures:
    """A schedule's calendars: a fire is closed when any of them closes it."""

    calendars: tuple[CalendarRules, ...]

    def closure(self, moment: datetime) -> Closure | None:
        """Why ``moment`` is closed, or None if every calendar is open then. A blackout
        comes first (nothing in it runs, whatever ``on_closed_day`` says), then the first
        calendar (by name) that closes its day."""
        for calendar in self.calendars:
            if found := calendar.blackout_closure(moment):
                return found
        for calendar in self.calendars:
            if found := calendar.day_closure(moment):
                return found
        return None

    def stretch(self, moment: datetime) -> tuple[datetime, datetime]:
        """The instants around ``moment``, [start, end), that ``closure()`` treats alike."""
        start, end = _FAR_PAST, _FAR_FUTURE
        for calendar in self.calendars:
            low, high = calendar.stretch(moment)
            start, end = max(start, low), min(end, high)
        return start, end


def calendar_errors(
    timezone: str,
    holidays_country: str,
    holidays_subdivision: str,
    closed_weekdays: Any,
    closed_dates: Any,
    blackouts: Any,
) -> list[tuple[str, str]]:
    """(field, message) for each value of a calendar that cannot be used."""
    errors = []
    try:
        triggers.parse_timezone(timezone)
    except InvalidTrigger as exc:
        errors.append(("timezone", str(exc)))
    if message := holidays_error(holidays_country, holidays_subdivision):
        field = "holidays_subdivision" if "subdivision" in message else "holidays_country"
        errors.append((field, message))
    checks: tuple[tuple[str, Callable[[Any], str | None], Any], ...] = (
        ("closed_weekdays", _weekdays_error, closed_weekdays),
        ("closed_dates", _dates_error, closed_dates),
        ("blackouts", _blackouts_error, blackouts),
    )
    for field, check, value in checks:
        if message := check(value):
            errors.append((field, message))
    return errors


def holidays_error(country: str, subdivision: str) -> str | None:
    """Why the ``holidays`` package cannot give these public holidays, or None."""
    if not country:
        return "A subdivision needs its country." if subdivision else None
    supported = _supported_countries()
    if supported is None:
        return f"Country {country!r}: {HOLIDAYS_MISSING}."
    if country not in supported:
        return f"Unknown holidays country {country!r} (an ISO 3166-1 code such as 'DE')."
    if subdivision and subdivision not in supported[country]:
        known = ", ".join(supported[country]) or "none"
        return f"Unknown subdivision {subdivision!r} of {country} (known: {known})."
    return None


def holidays_installed() -> bool:
    """Whether the optional ``holidays`` package can be imported."""
    return _supported_countries() is not None


@functools.cache
def _supported_countries() -> Mapping[str, list[str]] | None:
    try:
        holidays = importlib.import_module("holidays")
    except ImportError:
        return None
    supported: Mapping[str, list[str]] = holidays.list_supported_countries()
    return supported


def holiday_name(country: str, subdivision: str, day: date) -> str | None:
    """The name of the public holiday on ``day``, or None."""
    name = _holidays(country, subdivision, day.year).get(day)
    return None if name is None else str(name)


@functools.lru_cache(maxsize=256)
def _holidays(country: str, subdivision: str, year: int) -> Mapping[date, str]:
    if _supported_countries() is None:
        raise InvalidTrigger(f"Country {country!r}: {HOLIDAYS_MISSING}.")
    holidays = importlib.import_module("holidays")
    found = holidays.country_holidays(country, subdiv=subdivision or None, years=year)
    return dict(found.items())


def _weekdays_error(value: Any) -> str | None:
    if not isinstance(value, list) or not all(
        isinstance(day, int) and not isinstance(day, bool) and 0 <= day <= 6 for day in value
    ):
        return "Closed weekdays are a list of numbers from 0 (Monday) to 6 (Sunday)."
    if len(set(value)) == 7:
        return "A calendar closed every weekday never opens."
    return None


def _dates_error(value: Any) -> str | None:
    if not isinstance(value, list):
        return "Closed dates are a list of dates such as '2026-12-24'."
    if len(value) > MAX_CLOSED_DATES:
        return f"A calendar has at most {MAX_CLOSED_DATES:,} closed dates (got {len(value):,})."
    for day in value:
        try:
            parsed = date.fromisoformat(day) if isinstance(day, str) else None
        except ValueError:
            parsed = None
        if parsed is None or not bounds.EARLIEST.year <= parsed.year < bounds.LATEST.year:
            return f"{day!r} is not a date such as '2026-12-24' (years 1900 to 8999)."
    return None


def _blackouts_error(value: Any) -> str | None:
    if not isinstance(value, list):
        return 'Blackouts are a list of {"start": ..., "end": ..., "reason": ...}.'
    if len(value) > MAX_BLACKOUTS:
        return f"A calendar has at most {MAX_BLACKOUTS:,} blackouts (got {len(value):,})."
    for item in value:
        try:
            blackout = _blackout(item)
        except (InvalidTrigger, ValueError, TypeError, KeyError) as exc:
            return f"Blackout {item!r}: {exc}"
        if len(blackout.reason) > BLACKOUT_REASON_MAX_LENGTH:
            return f"A blackout's reason has at most {BLACKOUT_REASON_MAX_LENGTH} characters."
    return None


def _blackout(item: Any) -> Blackout:
    if not isinstance(item, dict) or not {"start", "end"} <= item.keys():
        raise InvalidTrigger('a blackout is {"start": ..., "end": ..., "reason": ...}.')
    start, end = _moment(item["start"], "start"), _moment(item["end"], "end")
    if end <= start:
        raise InvalidTrigger("its end is not after its start.")
    reason = item.get("reason", "")
    if not isinstance(reason, str):
        raise InvalidTrigger("its reason is text.")
    return Blackout(start, end, reason)


def _moment(value: Any, what: str) -> datetime:
    moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    if moment is None or moment.tzinfo is None:
        raise InvalidTrigger(f"its {what} is an ISO time with its UTC offset.")
    moment = moment.astimezone(UTC)
    if not bounds.EARLIEST <= moment < bounds.LATEST:
        raise InvalidTrigger(f"its {what} is out of range.")
    return moment


def _instant(wall: datetime, zone: Any) -> datetime:
    """A wall time in ``zone`` as UTC; one a DST change skips moves on by the change, one
    it repeats is the first."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


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
            candidate = _instant(wall + days * step, zone)
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
            return _ZERO, _SPAN
        if self.on_closed_day == OnClosedDay.PREVIOUS_OPEN_DAY:
            return -_SPAN, _ZERO
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
    return _instant(wall + days * _DAY, zone) - fire


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
