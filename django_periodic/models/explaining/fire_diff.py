"""``Schedule.fire_diff()``: which fires of the next days a change would add, remove or move,
computed on a copy of the schedule, with nothing saved (``timing/fire_diff.py`` says what
"moved" means and which flags a fire carries)."""

import copy
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_periodic.choices import OverrideAction
from django_periodic.db import clock
from django_periodic.models.calendars import closures_from, closures_of
from django_periodic.models.overrides import FireOverride
from django_periodic.models.schedule_fields import TRIGGER_FIELDS, ScheduleFields, runs_left
from django_periodic.models.trigger_rows import next_fire_times_of, trigger_of
from django_periodic.timing import business_days, dst, triggers
from django_periodic.timing import fire_diff as diffs

# The changes a diff can be asked for: what decides when a schedule fires.
DIFFABLE = frozenset({*TRIGGER_FIELDS, "rrule", "on_closed_day", "calendars", "overrides"})
MAX_DAYS = 366
# The most fires either side may hold: a diff is read by people (the window ends sooner).
MAX_FIRES = 100_000
_MICROSECOND = timedelta(microseconds=1)


class Diffing(ScheduleFields):
    """What a change would do to a schedule's next fires (docs/explain.md): ``fire_diff()``."""

    class Meta:
        abstract = True

    def fire_diff(
        self, days: int = 30, *, max_fires: int = MAX_FIRES, **changes: Any
    ) -> diffs.FireDiff:
        """Which fires of the next ``days`` days (from the database's clock) are added, removed
        or moved if ``changes`` were saved: trigger fields, ``timezone``, ``dst_gap`` /
        ``dst_repeat``, ``start_at`` / ``end_at``, ``on_closed_day``, ``calendars`` (a list of
        ``Calendar``) and ``overrides`` (a list of ``FireOverride``, saved or not, instead of
        its own). Nothing is saved. The window ends sooner, at the ``max_fires``-th fire of
        either side, when it would hold more (the diff's ``until`` says where). Raises
        ValueError for another field or a bad ``days``, and InvalidTrigger for a trigger that
        cannot be built. See docs/explain.md.
        """
        unknown = sorted(set(changes) - DIFFABLE)
        if unknown:
            raise ValueError(f"Not a change fire_diff() can preview: {', '.join(unknown)}.")
        if not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
            raise ValueError(f"days must be a whole number from 1 to {MAX_DAYS}.")
        using = self._state.db or "default"
        since = clock.now(using)
        until = since + timedelta(days=days)
        if not isinstance(max_fires, int) or not 1 <= max_fires <= MAX_FIRES:
            raise ValueError(f"max_fires must be a whole number from 1 to {MAX_FIRES:,}.")
        own = _overrides(self, using)
        old = _Side.of(self, _closures(self), own, since, until, max_fires)
        until = old.cut(until, max_fires)
        changed = copy.copy(self)
        for name, value in changes.items():
            if name not in ("calendars", "overrides"):
                setattr(changed, name, value)
        closures = closures_from(changes["calendars"]) if "calendars" in changes else old.closures
        overrides = changes.get("overrides", old.overrides)
        new = _Side.of(changed, closures, list(overrides), since, until, max_fires)
        until = old.cut(new.cut(until, max_fires), max_fires)
        flags = {**old.flags(new), **new.flags(None)}
        zones = (triggers.parse_timezone(self.timezone), triggers.parse_timezone(changed.timezone))
        return diffs.diff(old.fires, new.fires, zones, flags, since=since, until=until)


def _closures(schedule: ScheduleFields) -> business_days.Closures | None:
    try:
        return closures_of(schedule)
    except triggers.InvalidTrigger:
        return None  # as first_fire_time(): a calendar that cannot be used is left out


def _overrides(schedule: ScheduleFields, using: str) -> list[FireOverride]:
    if schedule.pk is None:
        return []
    return list(FireOverride.objects.using(using).filter(schedule_id=schedule.pk))


@dataclass
class _Side:
    """A schedule's fires in the window, as it is or as changed, and what they are."""

    schedule: ScheduleFields
    closures: business_days.Closures | None
    overrides: list[FireOverride]
    fires: list[datetime]

    @classmethod
    def of(
        cls,
        schedule: ScheduleFields,
        closures: business_days.Closures | None,
        overrides: list[FireOverride],
        since: datetime,
        until: datetime,
        most: int,
    ) -> "_Side":
        side = cls(schedule, closures, overrides, [])
        skipped = {override.plan_time for override in overrides}
        # One more than kept shows that the window holds more (cut() ends it sooner).
        computed = next_fire_times_of(schedule, closures, most + len(skipped) + 1, since, until)
        fires = [fire for fire in computed if fire not in skipped]
        fires += [
            override.move_to
            for override in overrides
            if override.action == OverrideAction.MOVE
            and override.move_to is not None
            and since < override.move_to <= until
        ]
        side.fires = sorted(set(_limited(schedule, fires)))
        return side

    def cut(self, until: datetime, most: int) -> datetime:
        """Keep its fires up to ``until``, and at most ``most`` of them; return the end of
        the window that holds them (``until``, or its last fire kept)."""
        self.fires = [fire for fire in self.fires if fire <= until]
        if len(self.fires) <= most:
            return until
        self.fires = self.fires[:most]
        return self.fires[-1]

    def flags(self, other: "_Side | None") -> dict[datetime, tuple[str, ...]]:
        """Each of its fires' flags; with ``other`` (the changed side), those ``other``
        closes or overrides too."""
        if not self.fires:
            return {}  # none to flag (a schedule after others has none on a clock)
        found: dict[datetime, list[str]] = defaultdict(list)
        for fire, flag in self._dst_flags():
            found[fire].append(flag)
        nominal = trigger_of(self.schedule)
        moved_to = {o.move_to for o in self.overrides if o.action == OverrideAction.MOVE}
        for fire in self.fires:
            if fire in moved_to:
                found[fire].append(diffs.OVERRIDDEN)
            elif self.closures is not None and nominal.next_after(fire - _MICROSECOND) != fire:
                found[fire].append(diffs.SHIFTED)
        if other is not None:
            overridden = {override.plan_time for override in other.overrides}
            for fire in self.fires:
                if other.closures is not None and other.closures.closure(fire) is not None:
                    found[fire].append(diffs.CLOSED)
                if fire in overridden:
                    found[fire].append(diffs.OVERRIDDEN)
        return {fire: tuple(dict.fromkeys(flags)) for fire, flags in found.items()}

    def _dst_flags(self) -> Iterable[tuple[datetime, str]]:
        """The fires a DST change makes of a cron trigger's skipped or repeated wall times."""
        bounded = trigger_of(self.schedule)
        cron = getattr(bounded, "trigger", None)
        if not isinstance(cron, triggers.CronTrigger) or not self.fires:
            return
        zone = triggers.parse_timezone(cron.timezone)
        for change in dst.offset_changes(zone, self.fires[0], self.fires[-1]):
            affected = dst.affected(cron, change)
            if affected is None:
                continue
            flag = diffs.DST_GAP if change.skips else diffs.DST_REPEAT
            for fire in affected.fires:
                yield fire, flag


def _limited(schedule: ScheduleFields, fires: list[datetime]) -> list[datetime]:
    """Its fires up to its ``max_runs``, of which ``fire_count`` have been planned."""
    left = runs_left(schedule.max_runs, schedule.fire_count)
    return fires if left is None else sorted(fires)[:left]
