"""RFC 5545 recurrences as a trigger: an RRULE line, with EXDATE and RDATE lines, read by
python-dateutil on the wall clock of an IANA time zone and anchored at the schedule's
start_at (its DTSTART).

dateutil lists a rule's wall times from its DTSTART on. The trigger keeps a window of them
(``_Frontier``) and, where the rule allows it, starts listing afresh a little before the
time asked about, so the planner's "first fire after now" costs a bisection, not a walk
from start_at. Wall times become instants by the DST rules cron uses
(``triggers.WallClockTrigger``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import threading
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from dateutil import rrule as du
from dateutil.relativedelta import relativedelta

from django_periodic.choices import DstGap, DstRepeat
from django_periodic.timing import bounds, rule_parts, rule_search
from django_periodic.timing.triggers import (
    InvalidTrigger,
    WallClockTrigger,
    check_dst_choices,
    parse_timezone,
)

# The longest text a rule may have: a rule, and a few years of dates skipped or added.
MAX_LENGTH = 4000
# The shortest time between fires is measured over this many of a rule's first fires: a
# few milliseconds, once per distinct rule and process (the planner checks it too).
SAMPLED_FIRES = 250
# Wall times kept per rule: enough for a planner's few questions about the times near now,
# and little memory for the thousands of rules a process may keep.
_WINDOW = 256
# Frequencies of a wall-clock rule, as cron's "*" in the minute or hour field: by default
# its fires in a DST gap are skipped and those in a repeat run in both passes. Coarser
# rules fire at a time of day: in a gap at the change, in a repeat once.
_WALL_CLOCK = (du.HOURLY, du.MINUTELY, du.SECONDLY)
_TIME = re.compile(r"(\d{8}T\d{6})(Z?)", re.IGNORECASE)
_UTC_UNTIL = re.compile(r"UNTIL=(\d{8}T\d{6})Z", re.IGNORECASE)
_TIME_FORMAT = "%Y%m%dT%H%M%S"
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class _Recurrence:
    """A parsed text: its rule (DTSTART set) and the wall times it adds and removes."""

    rule: du.rrule
    rdates: tuple[datetime, ...]
    exdates: tuple[datetime, ...]

    def walls(self, origin: datetime | None, budget: rule_search.Budget) -> Iterator[datetime]:
        """Its wall times in order, from ``origin`` (a DTSTART of the same phase) or its own;
        the walk spends from ``budget`` and raises RuleTooCostly once it is spent."""
        rule = rule_search.metered(self.rule, **({} if origin is None else {"dtstart": origin}))
        rule.budget = budget
        if not (self.rdates or self.exdates):
            return iter(rule)
        recurrence = du.rruleset()
        recurrence.rrule(rule)
        for wall in self.rdates:
            recurrence.rdate(wall)
        for wall in self.exdates:
            recurrence.exdate(wall)
        return iter(recurrence)

    def origin_near(self, wall: datetime, back: int = 2) -> datetime | None:
        """A later DTSTART, at least ``back`` periods before ``wall``, from which the rule
        lists the wall times it would have listed; None: only its own will do (a month's day
        past the 28th does not occur in every month). COUNT is gone by then: an UNTIL
        stands for it (``rule_search.uncounted``)."""
        rule, start = self.rule, self.rule._dtstart
        if wall <= start:
            return None
        if rule._freq in rule_search.PERIODS:
            period = rule_search.PERIODS[rule._freq] * rule._interval
            periods = (wall - start) // period - back
            return start + period * periods if periods > 0 else None
        if start.day > 28:
            return None
        months = rule_search.MONTHS[rule._freq] * rule._interval
        periods = ((wall.year - start.year) * 12 + wall.month - start.month) // months - back
        return start + relativedelta(months=months * periods) if periods > 0 else None


class _Frontier:
    """A rule's wall times from an origin on, listed in order; the latest ``_WINDOW`` kept.
    Every wall time at or after ``floor`` is kept or still to come. Each question spends
    one search's budget at most, or raises RuleTooCostly (the frontier is then spent)."""

    def __init__(
        self,
        recurrence: _Recurrence,
        origin: datetime | None,
        budget: rule_search.Budget | None = None,
    ) -> None:
        self.from_start = origin is None
        self.floor = datetime.min if origin is None else origin
        self.spent = False
        # A budget of its own is renewed for each question; one given is the asker's.
        self._renewed = budget is None
        self._budget = budget or rule_search.Budget()
        self._walls = recurrence.walls(origin, self._budget)
        self._kept: list[datetime] = []
        self._done = False

    @property
    def reached(self) -> datetime:
        """The latest wall time listed so far (its floor before any)."""
        return self._kept[-1] if self._kept else self.floor

    def after(self, wall: datetime) -> datetime | None:
        self._reach(wall)
        i = bisect.bisect_right(self._kept, wall)
        return self._kept[i] if i < len(self._kept) else None

    def at_or_before(self, wall: datetime) -> datetime | None:
        self._reach(wall)
        i = bisect.bisect_right(self._kept, wall)
        return self._kept[i - 1] if i else None

    def _reach(self, wall: datetime) -> None:
        """List wall times until one is after ``wall`` (or the rule ends), on a budget."""
        kept, budget = self._kept, self._budget
        if self._renewed:
            budget.renew()
        while not self._done and (not kept or kept[-1] <= wall):
            try:
                kept.append(next(self._walls))
            except rule_search.RuleTooCostly:
                self.spent = True  # dateutil's walk ended with the error: start afresh
                raise
            except (StopIteration, ValueError, OverflowError):
                self._done = True  # or past datetime's last year: no fire there either
            budget.spend()
            if len(kept) > _WINDOW:
                dropped = len(kept) // 2
                self.floor, self.from_start = kept[dropped], False
                del kept[:dropped]


class _Walls:
    """A rule's wall times for any trigger sharing it: one frontier, moved where asked."""

    def __init__(self, recurrence: _Recurrence) -> None:
        self._recurrence = recurrence
        self._lock = threading.Lock()  # a trigger is shared by the planner's threads
        self._frontier = _Frontier(recurrence, None)

    def after(self, wall: datetime) -> datetime | None:
        with self._lock:
            return self._near(wall).after(wall)

    def at_or_before(self, wall: datetime) -> datetime | None:
        with self._lock:
            found = self._near(wall).at_or_before(wall)
            if found is None and not self._frontier.from_start:
                found = self._further_back(wall)
            return found

    def _further_back(self, wall: datetime) -> datetime | None:
        """The latest wall time at or before ``wall`` of a rule whose fires are far apart
        (none since the kept frontier's origin): listed from origins twice as far back each
        time, on one search's budget, up to DTSTART."""
        budget, back = rule_search.Budget(), 4
        while True:
            origin = self._recurrence.origin_near(wall, back)
            found = _Frontier(self._recurrence, origin, budget).at_or_before(wall)
            if found is not None or origin is None:
                return found
            back *= 2

    def _near(self, wall: datetime) -> _Frontier:
        """The frontier to ask about ``wall``: the one kept, unless it has passed ``wall``
        or would list a walk of periods to reach it."""
        frontier, origin = self._frontier, self._recurrence.origin_near(wall)
        if frontier.spent or wall < frontier.floor or (origin and origin > frontier.reached):
            self._frontier = _Frontier(self._recurrence, origin)
        return self._frontier


class Sample(NamedTuple):
    """A rule's first fires, in figures: how many, and the shortest time between two."""

    fires: int
    shortest_gap: timedelta | None


@dataclass(frozen=True)
class RRuleTrigger(WallClockTrigger):
    """An RFC 5545 recurrence (``text``) on the wall clock of an IANA time zone, from
    ``start_at`` (its DTSTART, at its wall time there). DST: as cron, by ``dst_gap`` and
    ``dst_repeat``; empty, an hourly or finer rule follows the wall clock (a gap skipped,
    a repeat run twice), a coarser one runs at the change and once."""

    text: str
    start_at: datetime
    timezone: str = "UTC"
    dst_gap: str = ""
    dst_repeat: str = ""
    _tz: zoneinfo.ZoneInfo = field(init=False, repr=False, compare=False)
    _recurrence: _Recurrence = field(init=False, repr=False, compare=False)
    _memo: _Walls = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_dst_choices(self.dst_gap, self.dst_repeat)
        zone = parse_timezone(self.timezone)
        if not isinstance(self.start_at, datetime) or self.start_at.utcoffset() is None:
            raise InvalidTrigger("An RRULE starts at start_at: set it (an aware datetime).")
        recurrence = _parse(self.text, zone, self.start_at.astimezone(zone).replace(tzinfo=None))
        object.__setattr__(self, "_tz", zone)
        object.__setattr__(self, "_recurrence", recurrence)
        object.__setattr__(self, "_memo", _Walls(recurrence))

    @property
    def gap_rule(self) -> str:
        """A fire whose wall time a spring-forward skips: its ``dst_gap``, else skipped for
        a wall-clock (hourly or finer) rule and run at the change for a coarser one."""
        wall_clock = self._recurrence.rule._freq in _WALL_CLOCK
        return self.dst_gap or (DstGap.SKIP.value if wall_clock else DstGap.FIRST_VALID.value)

    @property
    def repeat_rule(self) -> str:
        """A fire whose wall time a fall-back repeats: its ``dst_repeat``, else both passes
        for a wall-clock (hourly or finer) rule and the first for a coarser one."""
        wall_clock = self._recurrence.rule._freq in _WALL_CLOCK
        return self.dst_repeat or (DstRepeat.BOTH.value if wall_clock else DstRepeat.ONCE.value)

    @property
    def period(self) -> timedelta | None:
        """FREQ times INTERVAL, for a rule of seconds, minutes or hours (else None): the
        shortest time between its fires unless BY parts add some within a period."""
        rule = self._recurrence.rule
        if rule._freq not in _WALL_CLOCK:
            return None
        interval: int = rule._interval
        return rule_search.PERIODS[rule._freq] * interval

    @property
    def sample(self) -> Sample:
        """Its first ``SAMPLED_FIRES`` wall times' fires, on which its bounds are judged:
        each wall time made an instant directly, not searched for; only the figures kept.
        Fewer where one search's budget finds fewer; RuleTooCostly where it finds none."""
        if isinstance(self._sampled, str):
            raise rule_search.RuleTooCostly(self._sampled)
        return self._sampled

    @functools.cached_property
    def _sampled(self) -> Sample | str:
        """The sample, or why there is none (kept, so a bad rule costs one search)."""
        walls: list[datetime] = []
        try:
            for wall in self._recurrence.walls(None, rule_search.Budget()):
                walls.append(wall)
                if len(walls) == SAMPLED_FIRES:
                    break
        except rule_search.RuleTooCostly as exc:
            if not walls:
                return str(exc)
        except (ValueError, OverflowError):
            pass  # past datetime's last year: the rule ends there
        instants = sorted({instant for wall in walls for instant in self._instants(wall)})
        gaps = (later - earlier for earlier, later in itertools.pairwise(instants))
        return Sample(len(instants), min(gaps, default=None))

    def _walls(self, start: datetime, backward: bool) -> Iterator[datetime]:
        step = self._memo.at_or_before if backward else self._memo.after
        wall = step(start)
        while wall is not None:
            yield wall
            wall = step(wall - _MICROSECOND if backward else wall)


@functools.lru_cache(maxsize=4096)
def rrule(
    text: str, start_at: datetime, timezone: str = "UTC", *, dst_gap: str = "", dst_repeat: str = ""
) -> RRuleTrigger:
    """An RRuleTrigger, shared: parsed once per distinct rule, its wall times kept."""
    return RRuleTrigger(text, start_at, timezone, dst_gap, dst_repeat)


def _parse(text: str, zone: zoneinfo.ZoneInfo, dtstart: datetime) -> _Recurrence:
    """The recurrence of ``text``: an RRULE line (or a bare rule), EXDATE and RDATE lines."""
    if not isinstance(text, str):
        raise InvalidTrigger(f"An RRULE must be text, got {type(text).__name__}.")
    if len(text) > MAX_LENGTH:
        raise InvalidTrigger(f"An RRULE has at most {MAX_LENGTH} characters, got {len(text)}.")
    rule = None
    dates: dict[str, list[datetime]] = {"RDATE": [], "EXDATE": []}
    for line in filter(None, (line.strip() for line in text.splitlines())):
        head, colon, value = line.partition(":")
        if not colon:  # a bare rule, "FREQ=...": it has no colon
            head, value = "RRULE", line
        name, _, parameters = head.partition(";")
        name = name.strip().upper()
        if name == "DTSTART":
            raise InvalidTrigger(
                "Remove the DTSTART line: a rule starts at the schedule's start_at."
            )
        if name == "RRULE":
            if rule is not None:
                raise InvalidTrigger("Give one RRULE line; add single fires with RDATE.")
            rule = _rule(value.strip(), zone, dtstart)
        elif name in dates:
            if parameters and parameters.strip().upper() != "VALUE=DATE-TIME":
                raise InvalidTrigger(
                    f"{name} takes no parameter ({parameters}): its times are wall times in "
                    "the schedule's time zone, or UTC times ending in Z."
                )
            dates[name] += (_wall(item.strip(), name, zone) for item in value.split(","))
        else:
            raise InvalidTrigger(
                f"Unknown line {name!r}: an RRULE line, with optional EXDATE and RDATE lines."
            )
    if rule is None:
        raise InvalidTrigger("An RRULE needs its rule, e.g. RRULE:FREQ=WEEKLY;BYDAY=MO.")
    return _Recurrence(rule, tuple(sorted(dates["RDATE"])), tuple(sorted(dates["EXDATE"])))


def _rule(value: str, zone: zoneinfo.ZoneInfo, dtstart: datetime) -> du.rrule:
    # A UNTIL in UTC is an instant: it bounds the rule at its wall time in the zone.
    value = _UTC_UNTIL.sub(lambda until: f"UNTIL={_utc_until(until[1], zone)}", value)
    try:
        rule = du.rrulestr(value, dtstart=dtstart)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError) as exc:
        raise InvalidTrigger(f"Invalid RRULE {value!r}: {exc or type(exc).__name__}.") from None
    if not isinstance(rule, du.rrule):
        raise InvalidTrigger(f"Invalid RRULE {value!r}: one rule expected.")
    if rule._interval < 1:
        raise InvalidTrigger(f"Invalid RRULE {value!r}: INTERVAL must be at least 1.")
    rule_parts.check(rule)
    return rule_search.uncounted(rule)


def _utc_until(item: str, zone: zoneinfo.ZoneInfo) -> str:
    return _wall(item + "Z", "UNTIL", zone).strftime(_TIME_FORMAT)


def _wall(item: str, name: str, zone: zoneinfo.ZoneInfo) -> datetime:
    """A naive wall time in ``zone`` from a date-time of the text (``Z``: a UTC instant)."""
    match = _TIME.fullmatch(item)
    try:
        if match is None:
            raise ValueError(item)
        wall = datetime.strptime(match.group(1), _TIME_FORMAT)
    except ValueError:
        raise InvalidTrigger(
            f"{name} {item!r} is not a date-time like 20261224T090000 (a wall time in the "
            "schedule's time zone), or 20261224T080000Z (UTC)."
        ) from None
    if match.group(2):
        wall = wall.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
    if not bounds.EARLIEST.year <= wall.year < bounds.LATEST.year:
        raise InvalidTrigger(
            f"{name} {item!r} is out of range: times are from {bounds.show(bounds.EARLIEST)} "
            f"to before {bounds.show(bounds.LATEST)}."
        )
    return wall
