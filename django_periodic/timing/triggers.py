"""Trigger math: when does a schedule fire?

Pure functions of (trigger, instant): no Django, no database. Every returned datetime is aware UTC.
croniter is used only as a "next wall time in these sets" engine behind this module; parsing,
validation, the Vixie day-of-month/day-of-week rule and DST handling are done here (each
field's syntax in timing/cron_fields.py).
"""

from __future__ import annotations

import abc
import copy
import functools
import itertools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from croniter import CroniterError, croniter

from django_periodic.choices import DstGap, DstRepeat
from django_periodic.timing import bounds
from django_periodic.timing.cron_fields import (
    FIELDS,
    MONTH_LENGTHS,
    FieldError,
    croniter_args,
    item_values,
)
from django_periodic.timing.cron_fields import (
    MACROS as MACROS,  # re-exported: triggers.MACROS stays
)
from django_periodic.timing.cron_fields import CronSpec as _CronSpec

_ZERO = timedelta(0)
_MINUTE = timedelta(minutes=1)
_MICROSECOND = timedelta(microseconds=1)


class InvalidTrigger(ValueError):
    """A trigger definition (cron expression, time zone, interval, datetime) is not valid."""


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    """Return the IANA time zone `name`, or raise InvalidTrigger."""
    # "localtime" is whatever the host is set to, so two machines would disagree on fire times.
    if not isinstance(name, str) or not name or name == "localtime":
        raise InvalidTrigger(f"Unknown time zone {name!r}.")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidTrigger(f"Unknown time zone {name!r}.") from exc


def _field(text: str, index: int) -> frozenset[int]:
    name, low, high, names = FIELDS[index]
    values: set[int] = set()
    try:
        for item in text.split(","):
            if not item:
                raise FieldError("empty list item")
            values.update(item_values(item, low, high, names))
    except FieldError as exc:
        raise InvalidTrigger(f"Invalid {name} field '{text}': {exc}.") from None
    return frozenset(values)


def _parse_cron(expression: str) -> _CronSpec:
    if not isinstance(expression, str):
        raise InvalidTrigger(f"Cron expression must be a string, got {type(expression).__name__}.")
    text = expression.strip()
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise InvalidTrigger(f"Unknown macro '{text}'; use one of {', '.join(MACROS)}.")
        text = MACROS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise InvalidTrigger(
            "Cron expression must have 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)}."
        )
    minutes, hours, days, months, weekdays = (_field(p, i) for i, p in enumerate(parts))
    days_and = parts[2].startswith("*") or parts[4].startswith("*")
    if days_and and min(days) > max(MONTH_LENGTHS[m - 1] for m in months):
        raise InvalidTrigger(
            f"Cron expression never fires: day-of-month '{parts[2]}' does not occur in month "
            f"'{parts[3]}'."
        )
    # Debian cron(8) gets its DST handling only for "fixed-time" jobs: entry.c flags MIN_STAR /
    # HR_STAR when the minute / hour field's first character is '*' (as @hourly's '0 * ...'
    # does), whatever follows. So '*/2' hours are a wildcard job and '0,*/20' minutes are not.
    fixed_time = not (parts[0].startswith("*") or parts[1].startswith("*"))
    weekdays = frozenset(d % 7 for d in weekdays)  # 7 is Sunday too
    return _CronSpec(minutes, hours, days, months, weekdays, days_and, fixed_time)


def validate_cron(expression: str) -> None:
    """Raise InvalidTrigger, naming the offending field, unless `expression` is a valid cron."""
    _parse_cron(expression)


def _naive_utc(value: datetime, what: str) -> datetime:
    """Naive UTC equivalent of an aware datetime; naive input is rejected."""
    if not isinstance(value, datetime):
        raise InvalidTrigger(f"{what} must be a datetime, got {type(value).__name__}.")
    if value.utcoffset() is None:
        raise InvalidTrigger(f"{what} must be timezone-aware, got naive {value.isoformat()}.")
    return value.astimezone(UTC).replace(tzinfo=None)


def _aware(naive_utc: datetime | None) -> datetime | None:
    return None if naive_utc is None else naive_utc.replace(tzinfo=UTC)


class Trigger(abc.ABC):
    """When a schedule fires."""

    @abc.abstractmethod
    def next_after(self, after: datetime) -> datetime | None:
        """First fire strictly after `after` (aware), as aware UTC, or None if no more fires."""

    @abc.abstractmethod
    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """Last fire at or before `moment` (aware), as aware UTC, or None."""


def check_dst_choices(dst_gap: str, dst_repeat: str) -> None:
    """Raise InvalidTrigger unless both are a DST choice (or empty: the trigger's default)."""
    if dst_gap not in ("", *DstGap.values) or dst_repeat not in ("", *DstRepeat.values):
        raise InvalidTrigger(
            f"dst_gap must be one of {', '.join(DstGap.values)} (or empty), and dst_repeat "
            f"one of {', '.join(DstRepeat.values)} (or empty)."
        )


class WallClockTrigger(Trigger):
    """A trigger whose fires are wall times of an IANA time zone (``_tz``), each made an
    instant by the DST rules: a wall time a spring-forward skips runs by ``gap_rule``, one a
    fall-back repeats by ``repeat_rule``. Subclasses list their wall times (``_walls``)."""

    _tz: zoneinfo.ZoneInfo

    @property
    @abc.abstractmethod
    def gap_rule(self) -> str:
        """The DstGap value applied to a wall time a spring-forward skips."""

    @property
    @abc.abstractmethod
    def repeat_rule(self) -> str:
        """The DstRepeat value applied to a wall time a fall-back repeats."""

    @abc.abstractmethod
    def _walls(self, start: datetime, backward: bool) -> Iterator[datetime]:
        """Its naive wall times after `start` (exclusive), or at/before it if backward."""

    def wall_times(self, first: datetime, end: datetime) -> tuple[datetime, ...]:
        """Its naive wall times in [first, end), before any DST rule (timing/dst.py)."""
        walls = self._walls(first - _MICROSECOND, backward=False)
        return tuple(itertools.takewhile(lambda wall: wall < end, walls))

    def next_after(self, after: datetime) -> datetime | None:
        start = _naive_utc(after, "after")
        # Inside a repeated (fall-back) hour, later instants can have earlier wall times, so
        # widen the window of wall times considered by the length of the repetition.
        local, slack = self._local(start)
        best = None
        for wall in self._walls(local - slack, backward=False):
            for instant in self._instants(wall):
                if instant > start and (best is None or instant < best):
                    best = instant
            if best is not None and wall >= local + slack:
                break
        return _aware(best)

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        end = _naive_utc(moment, "moment")
        local, slack = self._local(end)
        best = None
        for wall in self._walls(local + slack, backward=True):
            for instant in self._instants(wall):
                if instant <= end and (best is None or instant > best):
                    best = instant
            if best is not None and wall <= local - slack:
                break
        return _aware(best)

    def _local(self, naive_utc: datetime) -> tuple[datetime, timedelta]:
        """Local wall time of an instant and how long that wall time is repeated (0 if not)."""
        wall = naive_utc.replace(tzinfo=UTC).astimezone(self._tz).replace(tzinfo=None, fold=0)
        offsets = self._offsets(wall)
        return wall, max(offsets[0] - offsets[1], _ZERO)

    def _offsets(self, wall: datetime) -> tuple[timedelta, timedelta]:
        """UTC offsets of a wall time for fold=0 and fold=1; they differ only at a transition."""
        first = wall.replace(tzinfo=self._tz, fold=0).utcoffset()
        second = wall.replace(tzinfo=self._tz, fold=1).utcoffset()
        assert first is not None and second is not None
        return first, second

    def _instants(self, wall: datetime) -> tuple[datetime, ...]:
        """Naive UTC instants at which a matching wall time fires, per Debian's DST rule."""
        before, after = self._offsets(wall)
        if before == after:
            return (wall - before,)
        if before > after:  # repeated by a fall-back: first occurrence, or both in real time
            both = self.repeat_rule == DstRepeat.BOTH
            return (wall - before, wall - after) if both else (wall - before,)
        # Skipped by a spring-forward: at the change instant, or not at all.
        run = self.gap_rule == DstGap.FIRST_VALID
        return (self._transition(wall - after, wall - before),) if run else ()

    def _transition(self, low: datetime, high: datetime) -> datetime:
        """First instant in (low, high] whose offset differs from low's (naive UTC, seconds)."""
        offset, lo, hi = self._utc_offset(low), 0, int((high - low).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._utc_offset(low + timedelta(seconds=mid)) == offset:
                lo = mid
            else:
                hi = mid
        return low + timedelta(seconds=hi)

    def _utc_offset(self, naive_utc: datetime) -> timedelta | None:
        return self._tz.fromutc(naive_utc.replace(tzinfo=self._tz)).utcoffset()


@dataclass(frozen=True)
class CronTrigger(WallClockTrigger):
    """A 5-field cron expression evaluated on the wall clock of an IANA time zone."""

    expression: str
    timezone: str = "UTC"
    # Fires in a spring-forward gap ("skip", "first_valid") and in a fall-back repeat
    # ("once", "both"); empty: cron(8)'s rule (fixed-time jobs run at the change, and once;
    # wildcard jobs skip the gap, and run in both occurrences).
    dst_gap: str = ""
    dst_repeat: str = ""
    _spec: _CronSpec = field(init=False, repr=False, compare=False)
    _tz: zoneinfo.ZoneInfo = field(init=False, repr=False, compare=False)
    _croniter: croniter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_dst_choices(self.dst_gap, self.dst_repeat)
        spec = _parse_cron(self.expression)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_tz", parse_timezone(self.timezone))
        expression, day_or = croniter_args(spec)
        # Parsing dominates croniter's cost, so keep a parsed prototype and copy it per call;
        # the prototype itself is never advanced, which keeps the trigger safe to share.
        prototype = croniter(expression, datetime(2000, 1, 1), day_or=day_or)
        object.__setattr__(self, "_croniter", prototype)

    def _walls(self, start: datetime, backward: bool) -> Iterator[datetime]:
        """Matching naive wall times after `start` (exclusive), or at/before it if backward."""
        start = start.replace(second=0, microsecond=0) + (_MINUTE if backward else _ZERO)
        it = copy.copy(self._croniter)
        it.set_current(start, force=True)
        try:
            step = it.get_prev if backward else it.get_next
            while True:
                yield step(datetime)
        except (CroniterError, OverflowError):
            return  # no further matches within croniter's search horizon or datetime's range

    @property
    def gap_rule(self) -> str:
        """The rule applied to a fire whose wall time a spring-forward skips: its ``dst_gap``,
        else cron(8)'s (a fixed-time job runs at the change, a wildcard job skips it)."""
        fixed = self._spec.fixed_time
        return self.dst_gap or (DstGap.FIRST_VALID.value if fixed else DstGap.SKIP.value)

    @property
    def repeat_rule(self) -> str:
        """The rule applied to a fire whose wall time a fall-back repeats: its ``dst_repeat``,
        else cron(8)'s (a fixed-time job runs once, a wildcard job in both occurrences)."""
        fixed = self._spec.fixed_time
        return self.dst_repeat or (DstRepeat.ONCE.value if fixed else DstRepeat.BOTH.value)


@dataclass(frozen=True)
class IntervalTrigger(Trigger):
    """Fires at `anchor + k * every` for k = 0, 1, 2, ..."""

    every: timedelta
    anchor: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.every, timedelta) or self.every <= _ZERO:
            raise InvalidTrigger(f"Interval must be a positive timedelta, got {self.every!r}.")
        _naive_utc(self.anchor, "anchor")

    def next_after(self, after: datetime) -> datetime | None:
        anchor, start = _naive_utc(self.anchor, "anchor"), _naive_utc(after, "after")
        if start < anchor:
            return _aware(anchor)
        # timedelta // timedelta is exact integer arithmetic on microseconds: no drift.
        steps = (start - anchor) // self.every + 1
        try:
            return _aware(anchor + self.every * steps)
        except OverflowError:
            return None

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        anchor, end = _naive_utc(self.anchor, "anchor"), _naive_utc(moment, "moment")
        if end < anchor:
            return None
        return _aware(anchor + self.every * ((end - anchor) // self.every))


@dataclass(frozen=True)
class OnceTrigger(Trigger):
    """Fires once, at `run_at`."""

    run_at: datetime

    def __post_init__(self) -> None:
        _naive_utc(self.run_at, "run_at")

    def next_after(self, after: datetime) -> datetime | None:
        run_at = _naive_utc(self.run_at, "run_at")
        return _aware(run_at) if run_at > _naive_utc(after, "after") else None

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        run_at = _naive_utc(self.run_at, "run_at")
        return _aware(run_at) if run_at <= _naive_utc(moment, "moment") else None


@dataclass(frozen=True)
class BoundedTrigger(Trigger):
    """The fires of `trigger` with start_at <= fire <= end_at (either bound optional).

    Fires outside [bounds.EARLIEST, bounds.LATEST) do not exist either: a trigger near the
    end of time has no next fire, rather than one that overflows a datetime (or, in
    another time zone, the admin's page) or PostgreSQL's timestamp range.
    """

    trigger: Trigger
    start_at: datetime | None = None
    end_at: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trigger, Trigger):
            raise InvalidTrigger(f"trigger must be a Trigger, got {type(self.trigger).__name__}.")
        start = None if self.start_at is None else _naive_utc(self.start_at, "start_at")
        end = None if self.end_at is None else _naive_utc(self.end_at, "end_at")
        if start is not None and end is not None and end < start:
            raise InvalidTrigger(f"end_at {self.end_at} is before start_at {self.start_at}.")

    @property
    def first(self) -> datetime:
        """The earliest instant a fire may have."""
        if self.start_at is None:
            return bounds.EARLIEST
        return max(self.start_at, bounds.EARLIEST)

    @property
    def last(self) -> datetime:
        """The latest instant a fire may have."""
        latest = bounds.LATEST - _MICROSECOND
        return latest if self.end_at is None else min(self.end_at, latest)

    def next_after(self, after: datetime) -> datetime | None:
        _naive_utc(after, "after")
        # Datetimes have microsecond resolution, so this makes the first instant eligible.
        after = max(after, self.first - _MICROSECOND)
        if after >= self.last:
            return None  # and the inner trigger never looks past the end of time
        fire = self.trigger.next_after(after)
        return None if fire is None or fire > self.last else fire

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        _naive_utc(moment, "moment")
        if moment < self.first:
            return None
        fire = self.trigger.latest_at_or_before(min(moment, self.last))
        return None if fire is None or fire < self.first else fire


@functools.lru_cache(maxsize=4096)
def cron(
    expression: str, timezone: str = "UTC", *, dst_gap: str = "", dst_repeat: str = ""
) -> CronTrigger:
    """A CronTrigger, shared: parsing costs more than a next fire, and triggers are immutable."""
    return CronTrigger(expression, timezone, dst_gap, dst_repeat)


def fire_times(
    trigger: Trigger, n: int, after: datetime, until: datetime | None = None
) -> list[datetime]:
    """The next `n` fires of `trigger` strictly after `after`, up to `until` included (None:
    no end); fewer if it runs out. The one walk over a trigger's fires: the model's next
    fire times, the admin's preview, explain and the fire diff all take theirs from here."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    fires: list[datetime] = []
    while len(fires) < n and (fire := trigger.next_after(after)) is not None:
        if until is not None and fire > until:
            break
        fires.append(fire)
        after = fire
    return fires
