"""The preview's DST changes: each change of a cron or RRULE schedule's time zone in the next
two years that skips or repeats one of its wall times, in words, with the rule applied and
what runs (the math is the core's, ``django_periodic.timing.dst``)."""

import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.choices import DstGap, DstRepeat
from django_periodic.timing import dst, recurrences, triggers

HORIZON = timedelta(days=731)  # two years, whichever holds a leap day
# Wall times and fires named per change: a per-minute job has sixty of each an hour.
SHOWN = 4
RULE_NAMES = {
    DstGap.SKIP.value: gettext_lazy("skip"),
    DstGap.FIRST_VALID.value: gettext_lazy("first valid instant"),
    DstRepeat.ONCE.value: gettext_lazy("once"),
    DstRepeat.BOTH.value: gettext_lazy("both"),
}


@dataclass(frozen=True)
class DstChange:
    """One change as the preview shows it: its day, the offsets, the wall times it skips
    or repeats, the rule applied to them and what runs."""

    affected: dst.AffectedChange
    zone: zoneinfo.ZoneInfo = field(repr=False)
    cron: bool = True  # a cron's default rule is cron(8)'s; an RRULE's is by its frequency

    def date(self) -> str:
        return self.affected.change.at.astimezone(self.zone).strftime("%a %Y-%m-%d")

    def offsets(self) -> str:
        change = self.affected.change
        what = _("daylight saving time starts") if change.skips else _("daylight saving time ends")
        return f"{what}: {utc_offset(change.before)} → {utc_offset(change.after)}"

    def walls(self) -> str:
        walls = [wall.strftime("%H:%M") for wall in self.affected.walls]
        # The first few and the last: a per-minute job's sixty read as a range.
        times = (
            ", ".join(walls[: SHOWN - 1]) + f" … {walls[-1]}"
            if len(walls) > SHOWN
            else ", ".join(walls)
        )
        if self.affected.change.skips:
            words = ngettext("%(times)s does not exist", "%(times)s do not exist", len(walls))
        else:
            words = ngettext("%(times)s happens twice", "%(times)s happen twice", len(walls))
        return words % {"times": times}

    def rule(self) -> str:
        name = str(RULE_NAMES[self.affected.rule])
        if self.affected.declared:
            return name
        if not self.cron:
            return _("default (%(rule)s)") % {"rule": name}
        return _("cron(8) default (%(rule)s)") % {"rule": name}

    def result(self) -> str:
        fires = self.affected.fires
        if not fires:
            return _("not run")
        return _("runs %(fires)s") % {"fires": _listed([self._when(fire) for fire in fires])}

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.affected.change.at.isoformat(),
            "date": self.date(),
            "change": self.offsets(),
            "walls": self.walls(),
            "rule": self.rule(),
            "result": self.result(),
            "fires": [
                {"utc": fire.isoformat(), "local": fire.astimezone(self.zone).isoformat()}
                for fire in self.affected.fires
            ],
        }

    def _when(self, fire: datetime) -> str:
        local = fire.astimezone(self.zone).strftime("%H:%M %Z")
        return f"{local} ({fire.strftime('%H:%M')} UTC)"


@dataclass
class DstChanges:
    """The changes of the next two years that touch the schedule, and how many there are in
    its time zone (so that "none touches it" can be told from "its zone has none")."""

    changes: list[DstChange] = field(default_factory=list)
    in_zone: int = 0


def dst_changes(trigger: triggers.Trigger, now: datetime) -> DstChanges:
    """The DST changes of a schedule's (bounded) trigger in the two years after ``now``;
    none unless it is a cron or an RRULE."""
    if not isinstance(trigger, triggers.BoundedTrigger):
        return DstChanges()
    wall_clock = trigger.trigger
    if not isinstance(wall_clock, triggers.CronTrigger | recurrences.RRuleTrigger):
        return DstChanges()
    zone = triggers.parse_timezone(wall_clock.timezone)
    start, end = max(now, trigger.first), min(now + HORIZON, trigger.last)
    in_zone = dst.offset_changes(zone, start, end)
    # One fire more than is shown tells that there are more, without computing them all.
    found = (dst.affected(wall_clock, change, limit=SHOWN + 1) for change in in_zone)
    cron = isinstance(wall_clock, triggers.CronTrigger)
    changes = [DstChange(change, zone, cron) for change in found if change is not None]
    return DstChanges(changes, len(in_zone))


def utc_offset(offset: timedelta) -> str:
    """A UTC offset, e.g. "UTC+05:45"."""
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return f"UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _listed(items: list[str]) -> str:
    """The first few items, and "…" if there are more."""
    if len(items) <= SHOWN:
        return ", ".join(items)
    return ", ".join(items[: SHOWN - 1]) + ", …"
