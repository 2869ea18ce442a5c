"""The DST changes a cron or RRULE trigger meets: its time zone's UTC offset changes in a
span, the wall times of the trigger's own that each one skips or repeats, and the fires that
the trigger's rule (``gap_rule``, ``repeat_rule``) makes of them.

Cheap by construction: the zone is sampled once a day and each change found by bisection,
then the trigger is asked only about the few hours around each change, never stepped
through the span fire by fire.
"""

from __future__ import annotations

import math
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django_periodic.choices import DstGap
from django_periodic.timing import triggers
from django_periodic.timing.recurrences import RRuleTrigger

# Every zone's current rules put its offset changes weeks apart; sampling once a day finds
# each of them (two changes within one day that cancel out would be missed, and none exist).
_STEP = timedelta(days=1)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class OffsetChange:
    """A change of a zone's UTC offset: its first instant at the new offset (aware UTC), and
    the offsets before and after it."""

    at: datetime
    before: timedelta
    after: timedelta

    @property
    def skips(self) -> bool:
        """A spring-forward: the wall clock jumps ahead over some wall times (else a
        fall-back, which repeats some)."""
        return self.after > self.before

    @property
    def walls(self) -> tuple[datetime, datetime]:
        """The naive wall times it skips or repeats, as [first, end)."""
        at = self.at.replace(tzinfo=None)
        return at + min(self.before, self.after), at + max(self.before, self.after)


@dataclass(frozen=True)
class AffectedChange:
    """An offset change that skips or repeats some of a cron trigger's wall times, the rule
    applied to them, and what runs for them."""

    change: OffsetChange
    walls: tuple[datetime, ...]  # the trigger's naive wall times that it skips or repeats
    rule: str  # a DstGap value for a skip, a DstRepeat value for a repeat
    declared: bool  # the schedule's own choice, not cron(8)'s default
    fires: tuple[datetime, ...]  # what runs for them, aware UTC, in order; empty: not run
    # (the first ``limit`` of them, when asked for fewer)


def offset_changes(zone: zoneinfo.ZoneInfo, start: datetime, end: datetime) -> list[OffsetChange]:
    """The changes of ``zone``'s UTC offset after ``start``, up to ``end`` (both aware)."""
    changes: list[OffsetChange] = []
    low, offset = start, _offset(zone, start)
    while low < end:
        high = min(low + _STEP, end)
        if _offset(zone, high) == offset:
            low = high
            continue
        at = _first_instant_after(zone, low, high)
        changes.append(OffsetChange(at, offset, _offset(zone, at)))
        low, offset = at, changes[-1].after
    return changes


def affected(
    trigger: triggers.CronTrigger | RRuleTrigger, change: OffsetChange, limit: int | None = None
) -> AffectedChange | None:
    """What ``change`` does to ``trigger``'s fires (the first ``limit`` of them), or None if
    it skips or repeats none of its wall times."""
    walls = trigger.wall_times(*change.walls)
    if not walls:
        return None
    span = abs(change.after - change.before)
    if change.skips:
        rule, declared = trigger.gap_rule, bool(trigger.dst_gap)
        # Run at all, they run at the change (and as one fire, with any fire of its own
        # there): so a fire of the trigger at the change is theirs only under that rule.
        moved = rule == DstGap.FIRST_VALID
        fires = _fires(trigger, change.at, change.at + _MICROSECOND, limit) if moved else ()
    else:
        rule, declared = trigger.repeat_rule, bool(trigger.dst_repeat)
        # Every instant of the repetition, first pass and second, has one of these wall times.
        fires = _fires(trigger, change.at - span, change.at + span, limit)
    return AffectedChange(change, walls, rule, declared, fires)


def _offset(zone: zoneinfo.ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset


def _first_instant_after(zone: zoneinfo.ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The first instant in (low, high] at ``high``'s offset; changes fall on whole seconds."""
    offset = _offset(zone, high)
    lo, hi = math.floor(low.timestamp()), math.ceil(high.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(zone, datetime.fromtimestamp(mid, UTC)) == offset:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def _fires(
    trigger: triggers.Trigger, first: datetime, end: datetime, limit: int | None = None
) -> tuple[datetime, ...]:
    """The trigger's fires in [first, end), the first ``limit`` of them: a few hours hold a
    few hundred at most, yet each next fire within a repeat looks at all of its wall times."""
    fires: list[datetime] = []
    fire = trigger.next_after(first - _MICROSECOND)
    while fire is not None and fire < end and (limit is None or len(fires) < limit):
        fires.append(fire)
        fire = trigger.next_after(fire)
    return tuple(fires)
