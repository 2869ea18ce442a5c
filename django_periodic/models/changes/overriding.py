"""Overriding single fires: ``Schedule.skip_fire()``, ``move_fire()`` and
``clear_override()``, defined here and set on the class by name (docs/overrides.md).

An override names a real fire of the schedule (one its trigger gives and its calendars
let run). Made before its fire is planned, it is stored and the cursor moves to the
schedule's first effective time from where it was (``timing/overridden.py``): a fire moved
earlier is planned in time. Made when its fire was planned but its run has not started, it
also changes that run at once, in the same transaction (the ledger's ``override_runs``).
A fire whose run started or ended, or that passed without being planned, is refused.
"""

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import transaction

from django_periodic import choices, db
from django_periodic.db import clock
from django_periodic.models import saving
from django_periodic.models.calendars import closures_of
from django_periodic.models.changes.overrides import FireOverride
from django_periodic.models.trigger_rows import open_trigger_of, planning_trigger_of
from django_periodic.timing import bounds, overridden, triggers

if TYPE_CHECKING:
    from django_periodic.models.run import RunQuerySet
    from django_periodic.models.schedule import Schedule

REASON_MAX_LENGTH = 500
_MICROSECOND = timedelta(microseconds=1)
_NOT_STARTED = (choices.RunStatus.PENDING, choices.RunStatus.QUEUED)


def skip_fire(schedule: "Schedule", plan_time: datetime, reason: str, by: str = "") -> FireOverride:
    """Skip the fire at ``plan_time``: it records one skipped run (code ``overridden``)
    whose message names who skipped it and why. Raises ValidationError for a time that is
    not a fire of the schedule, a fire already started or past, or no reason."""
    override = FireOverride(schedule=schedule, plan_time=plan_time, reason=reason, by=by)
    override.action = FireOverride.Action.SKIP
    return _override(schedule, override)


def move_fire(
    schedule: "Schedule", plan_time: datetime, to: datetime, reason: str, by: str = ""
) -> FireOverride:
    """Run the fire at ``plan_time`` once at ``to`` instead; its run keeps ``plan_time``
    (so it can never run twice) and is released at ``to``. ``to`` must be in the future,
    within ``MAX_MOVE`` (7 days) of the plan time and strictly between the fires before and
    after it, where they run. Raises ValidationError otherwise, as ``skip_fire()`` does."""
    override = FireOverride(schedule=schedule, plan_time=plan_time, reason=reason, by=by)
    override.action, override.move_to = FireOverride.Action.MOVE, to
    return _override(schedule, override)


def clear_override(schedule: "Schedule", plan_time: datetime) -> None:
    """Remove the override of the fire at ``plan_time`` before its fire is planned: the
    fire runs at its own time again (if that has passed, its misfire policy decides).
    Raises ValidationError when there is none, or its fire was planned already: the
    override then stays, as the history of its run."""
    using = schedule._state.db or "default"
    FireOverride(schedule=schedule, plan_time=plan_time).clean()  # a time it could be
    with transaction.atomic(using=using):
        locked = _locked(schedule, using)
        found = locked.overrides.filter(plan_time=plan_time).first()
        if found is None:
            raise ValidationError({"plan_time": f"No override of the fire at {_shown(plan_time)}."})
        if run := _runs(locked, plan_time).first():
            raise ValidationError(
                {"plan_time": f"Its fire was planned (run {run.pk}, {run.status}): it stays."}
            )
        found.delete()
        _move_cursor(locked, min(plan_time, found.at), using)
    schedule.next_fire_at = locked.next_fire_at
    saving.wake_schedulers(using)


def _override(schedule: "Schedule", override: FireOverride) -> FireOverride:
    using = schedule._state.db or "default"
    now = clock.now(using)
    _check_values(override)
    with transaction.atomic(using=using):
        locked = _locked(schedule, using)
        override.schedule = locked
        trigger = _checked_fire(locked, override.plan_time, now)
        if override.move_to is not None:
            neighbours = _neighbours(locked, trigger, override.plan_time)
            if error := overridden.move_error(
                override.plan_time, override.move_to, neighbours, now
            ):
                raise ValidationError({"move_to": error})
        if locked.overrides.filter(plan_time=override.plan_time).exists():
            message = "This fire has an override already: clear it first (clear_override())."
            raise ValidationError({"plan_time": message})
        runs = _runs(locked, override.plan_time)
        statuses = list(runs.values_list("status", "attempt"))
        _check_not_started(statuses, locked, override, now)
        override.save(using=using)
        if statuses and db.ledger(using).override_runs(runs, override, now) < len(statuses):
            # A worker claimed it between our read and our update: it runs as planned.
            raise ValidationError({"plan_time": "Its run started meanwhile: it runs as planned."})
        if not statuses:
            _move_cursor(locked, min(override.plan_time, override.at), using)
    # The caller's instance too, so that saving it later does not put the old cursor back.
    schedule.next_fire_at = locked.next_fire_at
    saving.wake_schedulers(using)
    return override


def _check_values(override: FireOverride) -> None:
    override.clean()  # its times first: nothing below may convert one out of range
    reason, by = override.reason, override.by
    if len(by) > 150:
        raise ValidationError({"by": "At most 150 characters."})
    if not reason.strip():
        raise ValidationError({"reason": "An override needs its reason."})
    if len(reason) > REASON_MAX_LENGTH:
        raise ValidationError({"reason": f"A reason has at most {REASON_MAX_LENGTH} characters."})


def _locked(schedule: "Schedule", using: str) -> "Schedule":
    """The schedule's row, locked: the planner skips it meanwhile (SKIP LOCKED)."""
    return type(schedule).objects.using(using).select_for_update().get(pk=schedule.pk)


def _runs(schedule: "Schedule", plan_time: datetime) -> "RunQuerySet":
    """The ledger's runs of the fire at ``plan_time`` (one per scope)."""
    runs: RunQuerySet = schedule.runs.all()
    return runs.filter(trigger__in=choices.LEDGER_TRIGGERS, plan_time=plan_time)


def _checked_fire(schedule: "Schedule", plan_time: datetime, now: datetime) -> triggers.Trigger:
    """The fires that run (its trigger under its calendars); raises ValidationError, naming
    its next fires, unless ``plan_time`` is one of them."""
    try:
        trigger = open_trigger_of(schedule, closures_of(schedule))
        fire = trigger.next_after(plan_time - _MICROSECOND)
    except (triggers.InvalidTrigger, ValueError, OverflowError) as exc:
        raise ValidationError({"plan_time": f"Its fires cannot be found: {exc}"}) from None
    if fire != plan_time:
        coming = triggers.fire_times(trigger, 3, max(now, bounds.EARLIEST))
        shown = ", ".join(_shown(t) for t in coming) or "none"
        raise ValidationError(
            {"plan_time": f"{_shown(plan_time)} is not a fire of {schedule.name!r}; "
                          f"its next fires: {shown}."}
        )  # fmt: skip
    return trigger


def _check_not_started(
    statuses: list[tuple[str, int]], schedule: "Schedule", override: FireOverride, now: datetime
) -> None:
    """Refuse a fire whose run started or ended, and one passed over without a run."""
    for status, attempt in statuses:
        if status not in _NOT_STARTED or attempt:
            done = "ended" if status in choices.FINAL_STATUSES else "started"
            message = f"Its run has {done} ({status}): it cannot be overridden."
            raise ValidationError({"plan_time": message})
    cursor = schedule.next_fire_at
    unplanned = cursor == bounds.UNPLANNED
    if not statuses and not unplanned and (cursor is None or override.plan_time < cursor):
        raise ValidationError(
            {"plan_time": f"The fire at {_shown(override.plan_time)} is past and was never "
                          "planned: there is nothing to override."}
        )  # fmt: skip


def _neighbours(
    schedule: "Schedule", trigger: triggers.Trigger, plan_time: datetime
) -> tuple[datetime | None, datetime | None]:
    """Where the fires before and after ``plan_time`` run (moved, or at their own time)."""
    before = trigger.latest_at_or_before(plan_time - _MICROSECOND)
    after = trigger.next_after(plan_time)
    moved = dict(
        schedule.overrides.filter(plan_time__in=[t for t in (before, after) if t])
        .exclude(move_to=None)
        .values_list("plan_time", "move_to")
    )
    return (
        None if before is None else moved.get(before, before),
        None if after is None else moved.get(after, after),
    )


def _move_cursor(schedule: "Schedule", since: datetime, using: str) -> None:
    """Move the cursor to the first effective time from ``since`` (or where it was, if
    earlier): an override changed the times it walks. The schedule's row is locked."""
    cursor = schedule.next_fire_at
    if cursor is None or cursor == bounds.UNPLANNED:
        return  # no next fire, or the planner sets it from the trigger
    try:
        closures = closures_of(schedule)
    except triggers.InvalidTrigger:
        closures = None  # a bad calendar fails the schedule when due
    rows = schedule.overrides.filter(plan_time__gte=min(since, cursor) - overridden.MAX_MOVE)
    found = tuple(overridden.Override(p, m) for p, m in rows.values_list("plan_time", "move_to"))
    trigger = overridden.overridden(planning_trigger_of(schedule, closures), found)
    moved = trigger.next_after(min(since, cursor) - _MICROSECOND)
    if moved != cursor:
        type(schedule).objects.using(using).filter(pk=schedule.pk).update(next_fire_at=moved)
        schedule.next_fire_at = moved


def _shown(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
