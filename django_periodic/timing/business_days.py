"""Business days: which fires a schedule's calendars close.

Pure: no models, no database. A calendar (``CalendarRules``) closes whole days on its own
wall clock (closed weekdays, closed dates, public holidays from the optional ``holidays``
package) and blackout periods (instants, half-open ``[start, end)``). A schedule's calendars
(``Closures``) close a fire when any of them does, and tell the stretch around an instant
that they close alike. Which fires run, and where a shifted one goes, is ``open_fires``'s.
"""

from __future__ import annotations

import bisect
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django_periodic.timing import bounds, triggers
from django_periodic.timing.triggers import InvalidTrigger

# The farthest a fire is shifted; a fire with no open day that near is not run.
MAX_SHIFT_DAYS = 7
# The most closed dates, and blackouts, a calendar holds (docs/calendars.md).
MAX_CLOSED_DATES = 2_000
MAX_BLACKOUTS = 2_000
SHIFT_REACH = timedelta(days=MAX_SHIFT_DAYS + 1)  # a shift's reach, with room for DST changes
_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
# Before and after any instant a trigger fires at, so that a stretch's ends stay datetimes.
_FAR_PAST = bounds.EARLIEST - 2 * SHIFT_REACH
_FAR_FUTURE = bounds.LATEST + 2 * SHIFT_REACH
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
        start = min(instant(datetime.combine(day, time()), zone), moment)
        end = max(instant(datetime.combine(day + _DAY, time()), zone), moment + _MICROSECOND)
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


def instant(wall: datetime, zone: Any) -> datetime:
    """A wall time in ``zone`` as UTC; one a DST change skips moves on by the change, one
    it repeats is the first."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
