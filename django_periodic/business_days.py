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
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django_periodic import bounds, triggers
from django_periodic.choices import OnClosedDay
from django_periodic.triggers import InvalidTrigger, Trigger

# The farthest a fire is shifted; a fire with no open day that near is not run.
MAX_SHIFT_DAYS = 7
# The fires read to place one shifted fire: a trigger firing more often is refused.
SCAN_LIMIT = 5_000
# The most calendar closures (closed days, blackouts) skipped in one search.
JUMP_LIMIT = 10_000

_SPAN = timedelta(days=MAX_SHIFT_DAYS + 1)  # a shift's reach, with room for DST changes
_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
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
class CalendarRules:
    """One calendar's closed days and blackouts (``CalendarRules.parse`` checks a row's)."""

    name: str
    timezone: str
    holidays_country: str = ""
    holidays_subdivision: str = ""
    closed_weekdays: frozenset[int] = frozenset()  # 0 = Monday, as date.weekday()
    closed_dates: frozenset[date] = frozenset()
    blackouts: tuple[Blackout, ...] = ()

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
        zone = triggers.parse_timezone(self.timezone)
        day = moment.astimezone(zone).date()
        reason = self.day_reason(day)
        if reason is None:
            return None
        start = _instant(datetime.combine(day, time()), zone)
        end = max(_instant(datetime.combine(day + _DAY, time()), zone), moment + _MICROSECOND)
        return Closure(self.name, reason, self.timezone, start, end)

    def blackout_closure(self, moment: datetime) -> Closure | None:
        """The blackout of this calendar that ``moment`` is in, or None."""
        for blackout in self.blackouts:
            if blackout.start <= moment < blackout.end:
                why = f"blackout until {blackout.end:%Y-%m-%d %H:%M} UTC"
                reason = f"{why}: {blackout.reason}" if blackout.reason else why
                return Closure(
                    self.name, reason, self.timezone, blackout.start, blackout.end, blackout=True
                )
        return None


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
        if self.on_closed_day == OnClosedDay.SKIP:
            return self._next_open(after)
        forward = self.on_closed_day == OnClosedDay.NEXT_OPEN_DAY
        # A fire shifted forward comes from at most _SPAN before; one shifted back, after.
        start = max(after - _SPAN, bounds.EARLIEST) if forward else after
        best: datetime | None = None
        for fire in self._scan(self.trigger.next_after, start):
            if best is not None and fire > (best if forward else best + _SPAN):
                break
            moved = self.shifted(fire)
            if moved is not None and moved > after and (best is None or moved < best):
                best = moved
        return best

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        if self.on_closed_day == OnClosedDay.SKIP:
            return self._latest_open(moment)
        forward = self.on_closed_day == OnClosedDay.NEXT_OPEN_DAY
        start = moment if forward else min(moment + _SPAN, bounds.LATEST - _MICROSECOND)
        best: datetime | None = None
        for fire in self._scan(self._before, start, first=self.trigger.latest_at_or_before):
            if best is not None and fire < (best - _SPAN if forward else best):
                break
            moved = self.shifted(fire)
            if moved is not None and moved <= moment and (best is None or moved > best):
                best = moved
        return best

    def _before(self, fire: datetime) -> datetime | None:
        return self.trigger.latest_at_or_before(fire - _MICROSECOND)

    def _scan(
        self,
        step: Callable[[datetime], datetime | None],
        start: datetime,
        first: Callable[[datetime], datetime | None] | None = None,
    ) -> Iterable[datetime]:
        fire = (first or step)(start)
        for _ in range(SCAN_LIMIT):
            if fire is None:
                return
            yield fire
            fire = step(fire)
        raise InvalidTrigger(
            f"Shifting a closed fire reads at most {SCAN_LIMIT} fires around it: this trigger "
            "fires too often (or is closed too long) for on_closed_day other than 'skip'."
        )

    def _next_open(self, after: datetime) -> datetime | None:
        fire = self.trigger.next_after(after)
        for _ in range(JUMP_LIMIT):
            if fire is None:
                return None
            closure = self.closures.closure(fire)
            if closure is None:
                return fire
            fire = self.trigger.next_after(closure.end - _MICROSECOND)  # past the closed span
        raise InvalidTrigger(f"No open fire after {JUMP_LIMIT} closed days and blackouts.")

    def _latest_open(self, moment: datetime) -> datetime | None:
        fire = self.trigger.latest_at_or_before(moment)
        for _ in range(JUMP_LIMIT):
            if fire is None:
                return None
            closure = self.closures.closure(fire)
            if closure is None:
                return fire
            fire = self.trigger.latest_at_or_before(closure.start - _MICROSECOND)
        raise InvalidTrigger(f"No open fire before {JUMP_LIMIT} closed days and blackouts.")


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
