"""A schedule row's trigger: which kind it is, the one place where a row becomes a pure
trigger (``trigger_of``), the ranges of its trigger fields, and the rules of the names a
schedule that fires after others (``after``) lists.

A row is a ``Schedule`` or a due row the planner loaded (``TriggerRow``); the kind rule is
written once here, in Python (``kind_of``) and as the SQL filters built beside it
(``KIND_FILTERS``), which a test checks against each other.
"""

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db.models import Q

from django_periodic.choices import FINAL_STATUSES, AfterOutcome, RunStatus, ScheduleKind

# KIND_FIELDS is pure (@job reads it too): choices.py holds it, re-exported here.
from django_periodic.choices import KIND_FIELDS as KIND_FIELDS
from django_periodic.conf import get_settings
from django_periodic.timing import bounds, business_days, open_fires, recurrences, triggers

# The kind rule in SQL: which rows are of each kind, by the field that carries it
# (KIND_FIELDS): cron wins, then interval, then run_at, then rrule, then after.
KIND_FILTERS = {
    ScheduleKind.CRON: ~Q(cron=""),
    ScheduleKind.INTERVAL: Q(cron="", interval__isnull=False),
    ScheduleKind.ONCE: Q(cron="", interval__isnull=True, run_at__isnull=False),
    ScheduleKind.RRULE: Q(cron="", interval__isnull=True, run_at__isnull=True) & ~Q(rrule=""),
    ScheduleKind.AFTER: Q(cron="", interval__isnull=True, run_at__isnull=True, rrule="")
    & ~Q(after=[]),
}


# The rows whose trigger reads created_at: an interval without start_at, which anchors at
# its creation (trigger_of). Loading a timestamp costs: the planner loads it for these only.
ANCHORED_AT_CREATION = KIND_FILTERS[ScheduleKind.INTERVAL] & Q(start_at__isnull=True)


class TriggerRow(Protocol):
    """The columns a trigger is built from: a ``Schedule``, or a due row the planner loaded."""

    @property
    def cron(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def dst_gap(self) -> str: ...
    @property
    def dst_repeat(self) -> str: ...
    @property
    def interval(self) -> timedelta | None: ...
    @property
    def run_at(self) -> datetime | None: ...
    @property
    def rrule(self) -> str: ...
    @property
    def start_at(self) -> datetime | None: ...
    @property
    def end_at(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime | None: ...
    @property
    def on_closed_day(self) -> str: ...


def kind_of(row: TriggerRow) -> str:
    """The ``Schedule.Kind`` of a row's trigger ("" if none is set)."""
    if row.cron:
        return ScheduleKind.CRON
    if row.interval is not None:
        return ScheduleKind.INTERVAL
    if row.run_at is not None:
        return ScheduleKind.ONCE
    if row.rrule:
        return ScheduleKind.RRULE
    # A due row the planner loaded has no ``after``: a downstream is never due by the
    # clock. Whatever a row holds there (a list, or a bad value stored past clean()) counts.
    return ScheduleKind.AFTER if getattr(row, "after", None) not in (None, [], "") else ""


def trigger_of(row: TriggerRow) -> triggers.Trigger:
    """The fire times of a row as a pure trigger: the one place where a row becomes one.

    Raises InvalidTrigger for a bad row, however it was stored: no trigger, an invalid cron
    or time zone, a time out of range, an interval shorter than the MIN_INTERVAL setting.
    """
    errors = trigger_field_errors(row)
    if errors:
        raise triggers.InvalidTrigger(" ".join(message for _, message in errors))
    kind = kind_of(row)
    inner: triggers.Trigger
    if kind == ScheduleKind.CRON:
        inner = triggers.cron(
            row.cron, row.timezone, dst_gap=row.dst_gap, dst_repeat=row.dst_repeat
        )
    elif kind == ScheduleKind.INTERVAL:
        assert row.interval is not None  # what makes the kind INTERVAL
        anchor = row.start_at or row.created_at  # ANCHORED_AT_CREATION in SQL
        if anchor is None:
            raise triggers.InvalidTrigger("An interval needs its anchor: start_at or created_at.")
        inner = triggers.IntervalTrigger(row.interval, anchor)
    elif kind == ScheduleKind.ONCE:
        assert row.run_at is not None  # what makes the kind ONCE
        inner = triggers.OnceTrigger(row.run_at)
    elif kind == ScheduleKind.RRULE:
        inner = _rrule_of(row)
    elif kind == ScheduleKind.AFTER:
        raise triggers.InvalidTrigger(
            "It fires after other schedules (after), not on a clock: it has no fire times."
        )
    else:
        raise triggers.InvalidTrigger("A schedule needs a cron, an interval, a run_at or an rrule.")
    return triggers.BoundedTrigger(inner, row.start_at, row.end_at)


def open_trigger_of(row: TriggerRow, closures: business_days.Closures | None) -> triggers.Trigger:
    """The fires that run: the row's trigger under its calendars' ``closures`` (closed
    fires left out or shifted, by ``on_closed_day``); without calendars, its trigger."""
    trigger = trigger_of(row)
    if closures is None:
        return trigger
    return open_fires.OpenTrigger(trigger, closures, row.on_closed_day)


def next_fire_times_of(
    row: TriggerRow,
    closures: business_days.Closures | None,
    n: int,
    after: datetime,
    until: datetime | None = None,
) -> list[datetime]:
    """The next ``n`` fires that run (``open_trigger_of``) strictly after ``after``, up to
    ``until`` included: ``Schedule.next_fire_times()``, the admin's preview and the fire
    diff read them here. One that fires after other schedules has none by the clock."""
    if kind_of(row) == ScheduleKind.AFTER:
        return []
    return triggers.fire_times(open_trigger_of(row, closures), n, after, until)


def planning_trigger_of(
    row: TriggerRow, closures: business_days.Closures | None
) -> triggers.Trigger:
    """What the planner's cursor walks: the fires that run and, under calendars, the first
    closed fire of each closed span (``open_fires.PlanningTrigger``)."""
    trigger = open_trigger_of(row, closures)
    if isinstance(trigger, open_fires.OpenTrigger):
        return open_fires.PlanningTrigger(trigger)
    return trigger


def first_fire_time_of(
    row: TriggerRow, now: datetime, closures: business_days.Closures | None = None
) -> datetime | None:
    """The cursor of a new or re-triggered schedule: the first fire after ``now``.

    A one-shot keeps its ``run_at`` even when it has passed: firing late or not
    is the misfire policy's decision, and it must not vanish silently. One that fires
    after other schedules has none: NULL, so that no planner finds it due by the clock.
    """
    if kind_of(row) == ScheduleKind.AFTER:
        return None
    trigger = planning_trigger_of(row, closures)
    if kind_of(row) == ScheduleKind.ONCE:
        assert row.run_at is not None  # what makes the kind ONCE
        return trigger.next_after(row.run_at - timedelta(microseconds=1))
    return trigger.next_after(now)


# The bounded fields a trigger is built from (bounds.SCHEDULE holds their ranges).
_BOUNDED_TRIGGER_FIELDS = ("run_at", "start_at", "end_at")
# The ranged fields trigger_field_errors checks (clean() checks the others' ranges alone).
CHECKED_WITH_TRIGGER = (*_BOUNDED_TRIGGER_FIELDS, "interval")


def trigger_field_errors(row: TriggerRow) -> list[tuple[str, str]]:
    """(field, message) for each trigger field of ``row`` out of its range: a time outside
    [bounds.EARLIEST, bounds.LATEST), an interval outside its range or below MIN_INTERVAL."""
    errors = []
    for name in _BOUNDED_TRIGGER_FIELDS:
        message = bounds.SCHEDULE[name].error(name, getattr(row, name))
        if message:
            errors.append((name, message))
    message = None if row.interval is None else _interval_error(row.interval)
    errors = [*errors, ("interval", message)] if message else errors
    if kind_of(row) == ScheduleKind.RRULE and not errors:
        errors += _rrule_errors(row)
    return errors


def _rrule_of(row: TriggerRow) -> recurrences.RRuleTrigger:
    """The row's RRULE, anchored at its start_at (the rule's DTSTART)."""
    if row.start_at is None:
        raise triggers.InvalidTrigger("An RRULE starts at start_at (its DTSTART): set start_at.")
    return recurrences.rrule(
        row.rrule, row.start_at, row.timezone, dst_gap=row.dst_gap, dst_repeat=row.dst_repeat
    )


def _rrule_errors(row: TriggerRow) -> list[tuple[str, str]]:
    """Its text readable, anchored, with a fire, and no two fires closer than the
    MIN_INTERVAL setting: by its period, and over a sample of its first fires."""
    if len(row.rrule) > recurrences.MAX_LENGTH:  # before it is parsed at all
        shown = f"{len(row.rrule)} characters"
        return [("rrule", f"An RRULE has at most {recurrences.MAX_LENGTH} characters ({shown}).")]
    if row.start_at is None:
        return [("start_at", "An RRULE starts at start_at (its DTSTART): set start_at.")]
    try:
        triggers.parse_timezone(row.timezone)
    except triggers.InvalidTrigger:
        return []  # the time zone's own error (and building the trigger raises it)
    try:
        trigger = _rrule_of(row)
        sample = trigger.sample  # a search on a budget: RuleTooCostly if it finds no fire
    except triggers.InvalidTrigger as exc:
        return [("rrule", str(exc))]
    if not sample.fires:
        return [("rrule", f"This rule has no fire after {bounds.show(row.start_at)}.")]
    minimum = get_settings().MIN_INTERVAL
    gaps = (trigger.period, sample.shortest_gap)
    shortest = min((gap for gap in gaps if gap is not None), default=None)
    if shortest is not None and shortest < minimum:
        shown, least = bounds.show(shortest), bounds.show(minimum)
        return [("rrule", f"This rule fires {shown} apart, under MIN_INTERVAL ({least}).")]
    return []


def _interval_error(interval: timedelta) -> str | None:
    if interval <= timedelta(0):
        return "The interval must be positive."
    # A setting, so that a deployment can ask for more than the database's floor; a row
    # below it that was stored anyway (or before it was raised) is refused here.
    minimum = get_settings().MIN_INTERVAL
    if interval < minimum:
        shown, least = bounds.show(interval), bounds.show(minimum)
        return f"The interval ({shown}) must be at least MIN_INTERVAL ({least})."
    return bounds.SCHEDULE["interval"].error("interval", interval)


# -- runs after runs (``after``): the rules of a downstream schedule's upstream names ---------
#
# One home for them: ``Schedule.clean()`` (and so the admin's form) refuses a bad list, and
# the planning pass (engine/planning/after.py) judges the rows stored past it, by the same
# functions: a list of distinct names, none its own, each an existing schedule, no cycle.

# The downstream schedules (``after`` set): the planning pass reads these alone, by their
# index (periodic_schedule_downstream).
DOWNSTREAM = ~Q(after=[])


def counting_statuses(after_outcome: str) -> tuple[str, ...]:
    """The end states of an upstream's run that let its downstream fire, by its
    ``after_outcome`` (a value this release does not know: success alone)."""
    if after_outcome == AfterOutcome.FINISHED:
        return FINAL_STATUSES
    return (RunStatus.SUCCEEDED,)


def shape_error(after: Any, own_name: str) -> str | None:
    """Why ``after`` is not a list of distinct schedule names other than ``own_name``."""
    if not isinstance(after, list) or not all(isinstance(n, str) and n for n in after):
        return 'after must be a JSON list of schedule names, e.g. ["extract"].'
    if len(set(after)) != len(after):
        return "after names a schedule twice."
    if own_name in after:
        return "A schedule cannot run after itself."
    return None


def missing_error(missing: Iterable[str]) -> str:
    names = ", ".join(repr(name) for name in sorted(missing))
    return f"after names no existing schedule: {names}."


def cycle_error(cycle: Sequence[str]) -> str:
    return "after makes a cycle: " + " -> ".join(cycle) + "."


def cycle_through(name: str, edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The cycle through ``name`` in ``edges`` (a schedule's name: the names it runs
    after), as the path from ``name`` back to it; None if there is none."""
    path: list[str] = [name]
    seen: set[str] = set()

    def visit(node: str) -> bool:
        for upstream in edges.get(node, ()):
            if upstream == name:
                path.append(name)
                return True
            if upstream in seen:
                continue
            seen.add(upstream)
            path.append(upstream)
            if visit(upstream):
                return True
            path.pop()
        return False

    return path if visit(name) else None
