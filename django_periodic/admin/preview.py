"""A trigger in words and its next fire times, for the schedule page and its live preview."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from cron_descriptor import ExpressionDescriptor, FormatException, Options
from django.template.loader import render_to_string
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from django_periodic.admin import display, dst_preview
from django_periodic.admin.changes import overrides
from django_periodic.models import Schedule
from django_periodic.models.trigger_rows import next_fire_times_of, open_trigger_of
from django_periodic.timing import business_days, open_fires, triggers
from django_periodic.timing.business_days import Closures

FIRE_TIMES = 10
# The closed fires listed at most among the next fires (a per-second schedule has 172,800
# on a weekend).
CLOSED_FIRES = 10


@dataclass(frozen=True)
class FireTime:
    """One future fire: in UTC, on the schedule's wall clock, and any UTC offset change."""

    utc: datetime
    local: datetime
    offset_change: str = ""
    closed: str = ""  # a closed fire: which calendar closed it, why, and what became of it
    override: str = ""  # an overridden fire: skipped, or where it runs (admin/changes/overrides.py)
    skipped: bool = False


@dataclass
class Preview:
    """What the trigger means, when it fires next, or why it cannot be read."""

    description: str = ""
    timezone: str = "UTC"
    fires: list[FireTime] = field(default_factory=list)
    errors: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # A cron's DST changes in the next two years, with its rule applied (dst_preview.py).
    dst: dst_preview.DstChanges = field(default_factory=dst_preview.DstChanges)

    def table(self) -> list[tuple[str, str, str, str, str, bool]]:
        """``rows()``, each with its override in words and whether it is struck through
        (closed or skipped)."""
        return [
            (*row, fire.override, bool(fire.closed) or fire.skipped)
            for row, fire in zip(self.rows(), self.fires, strict=True)
        ]

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(wall time, UTC time, offset change, closed) as text; seconds only where a fire
        has some."""
        seconds = any(fire.utc.second or fire.utc.microsecond for fire in self.fires)
        clock = "%H:%M:%S" if seconds else "%H:%M"
        return [
            (
                f"{fire.local.strftime(f'%a %Y-%m-%d {clock} %Z')} ({_utc_offset(fire.local)})",
                fire.utc.strftime(f"%Y-%m-%d {clock}"),
                fire.offset_change,
                fire.closed,
            )
            for fire in self.fires
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "timezone": self.timezone,
            "fires": [
                {
                    "utc": fire.utc.isoformat(),
                    "local": fire.local.isoformat(),
                    "offset_change": fire.offset_change,
                    "closed": fire.closed,
                    "override": fire.override,
                }
                for fire in self.fires
            ],
            "errors": self.errors,
            "notes": self.notes,
            "dst_changes": [change.as_json() for change in self.dst.changes],
        }


@functools.lru_cache(maxsize=1024)
def describe_cron(expression: str) -> str:
    """A cron expression in English words, read the way Vixie cron reads it."""
    text = triggers.MACROS.get(expression.strip().lower(), expression.strip())
    options = Options()
    options.use_24hour_time_format = True
    try:
        words: str = ExpressionDescriptor(text, options).get_description()
    except (FormatException, ValueError, KeyError, IndexError):
        return expression
    parts = text.split()
    both_restricted = len(parts) == 5 and "*" not in (parts[2], parts[4])
    if both_restricted and (parts[2].startswith("*") or parts[4].startswith("*")):
        # Vixie cron: a day field starting with "*" makes both day fields apply, where
        # cron-descriptor reads them as either, as it does for plain lists.
        words = words.replace(", or on ", ", and only on ")
    return words


def describe_interval(interval: timedelta) -> str:
    """A positive duration in words, e.g. "1 hour 30 minutes"."""
    seconds = int(interval.total_seconds())
    units: list[tuple[int, Callable[[int], str]]] = [
        (86400, lambda n: ngettext("%(n)d day", "%(n)d days", n)),
        (3600, lambda n: ngettext("%(n)d hour", "%(n)d hours", n)),
        (60, lambda n: ngettext("%(n)d minute", "%(n)d minutes", n)),
        (1, lambda n: ngettext("%(n)d second", "%(n)d seconds", n)),
    ]
    words = []
    for size, name in units:
        count, seconds = divmod(seconds, size)
        if count:
            words.append(name(count) % {"n": count})
    if interval.microseconds:
        words.append(f"{interval.microseconds} µs")
    return " ".join(words) or str(interval)


def describe(schedule: Schedule, *, bounds: bool = True) -> str:
    """The schedule's trigger in words (with its bounds); empty if it has no trigger."""
    kind = schedule.trigger_kind
    if kind == Schedule.Kind.CRON:
        words = describe_cron(schedule.cron)
    elif kind == Schedule.Kind.INTERVAL:
        assert schedule.interval is not None  # what makes the kind INTERVAL
        words = _("Every %(interval)s") % {"interval": describe_interval(schedule.interval)}
    elif kind == Schedule.Kind.ONCE:
        assert schedule.run_at is not None  # what makes the kind ONCE
        words = _("Once, at %(when)s") % {"when": _format(schedule.run_at, schedule.timezone)}
    elif kind == Schedule.Kind.RRULE:
        rule = " ".join(line.strip() for line in schedule.rrule.splitlines() if line.strip())
        words = _("RRULE %(rule)s") % {"rule": rule}
    elif kind == Schedule.Kind.AFTER:
        after = schedule.after
        names = ", ".join(map(str, after)) if isinstance(after, list) else str(after)
        words = _("After %(names)s: once for each plan time they ran for") % {"names": names}
    else:
        return ""
    if bounds and schedule.start_at:
        words += _(", from %(when)s") % {"when": _format(schedule.start_at, schedule.timezone)}
    if bounds and schedule.end_at:
        words += _(", until %(when)s") % {"when": _format(schedule.end_at, schedule.timezone)}
    return words


def preview(
    schedule: Schedule,
    now: datetime,
    errors: dict[str, list[str]] | None = None,
    closures: Closures | None = None,
) -> Preview:
    """The next fire times of ``schedule`` after ``now`` under its calendars' ``closures``,
    with the closed fires among them; none while its trigger has errors."""
    result = Preview(timezone=schedule.timezone or "UTC", errors=dict(errors or {}))
    if result.errors or not schedule.trigger_kind:
        return result
    if schedule.trigger_kind == Schedule.Kind.AFTER:
        result.description = describe(schedule)  # no fire times of its own: its upstreams'
        return result
    try:
        zone = triggers.parse_timezone(schedule.timezone)
        times = next_fire_times_of(schedule, closures, FIRE_TIMES, now)
        trigger = open_trigger_of(schedule, closures)
        closed = _closed_fires(trigger, now, times[-1] if times else None)
        result.dst = dst_preview.dst_changes(schedule.trigger, now)
        result.description = describe(schedule)
    except display.UNRENDERABLE as exc:  # an InvalidTrigger, or a row stored past validation
        result.errors["__all__"] = [str(exc)]
        return result
    previous = now.astimezone(zone)
    found = overrides.marks(schedule, times)
    for utc, note in sorted([*((t, "") for t in times), *closed]):
        local = utc.astimezone(zone)
        fire = FireTime(utc, local, _offset_change(previous, local), note)
        if override := found.get(utc) if not note else None:
            fire = replace(
                fire, override=overrides.mark_text(override), skipped=not override.move_to
            )
        result.fires.append(fire)
        previous = local
    if len(closed) == CLOSED_FIRES:
        result.notes.append(
            _("More closed fires follow; the first %(n)d are listed.") % {"n": CLOSED_FIRES}
        )
    if not times:
        result.notes.append(_("It has no fire after now."))
    if result.dst.in_zone and not result.dst.changes:
        result.notes.append(
            _("No daylight saving time change in the next two years skips or repeats its fires.")
        )
    if not schedule.enabled:
        result.notes.append(_("It is paused: these times fire only if it is resumed."))
    return result


def _closed_fires(
    trigger: triggers.Trigger, now: datetime, last: datetime | None
) -> list[tuple[datetime, str]]:
    """The trigger's closed fires after ``now`` up to ``last`` (the last open one listed),
    each with its calendar, reason and fate; at most CLOSED_FIRES."""
    if not isinstance(trigger, open_fires.OpenTrigger):
        return []
    closed: list[tuple[datetime, str]] = []
    fire = trigger.trigger.next_after(now)
    while fire is not None and (last is None or fire <= last) and len(closed) < CLOSED_FIRES:
        closure = trigger.closures.closure(fire)
        if closure is not None:
            closed.append((fire, _fate(trigger, fire, closure)))
        elif last is None:
            break  # open, yet not among the fires: past the end of what is listed
        fire = trigger.trigger.next_after(fire)
    return closed


def _fate(trigger: open_fires.OpenTrigger, fire: datetime, closure: business_days.Closure) -> str:
    moved = trigger.shifted(fire)
    if moved is None:
        return _("closed (%(why)s): not run") % {"why": closure}
    zone = triggers.parse_timezone(closure.timezone)
    when = moved.astimezone(zone).strftime("%a %Y-%m-%d %H:%M %Z")
    return _("closed (%(why)s): runs %(when)s") % {"why": closure, "when": when}


def render(result: Preview) -> str:
    """The preview as an HTML fragment (the page and the live JSON view both use it)."""
    return render_to_string("django_periodic/admin/preview.html", {"preview": result})


def _offset_change(before: datetime, after: datetime) -> str:
    if before.utcoffset() == after.utcoffset():
        return ""
    starts = (after.dst() or timedelta(0)) > (before.dst() or timedelta(0))
    what = _("daylight saving time starts") if starts else _("daylight saving time ends")
    return _("%(what)s: %(old)s → %(new)s") % {
        "what": what,
        "old": _utc_offset(before),
        "new": _utc_offset(after),
    }


def _utc_offset(value: datetime) -> str:
    """The UTC offset of an aware datetime, e.g. "UTC+02:00"."""
    return dst_preview.utc_offset(value.utcoffset() or timedelta(0))


def _format(value: datetime, zone_name: str) -> str:
    try:
        zone: tzinfo = triggers.parse_timezone(zone_name)
    except triggers.InvalidTrigger:
        zone = UTC
    return display.local(value, zone).strftime("%Y-%m-%d %H:%M %Z")
