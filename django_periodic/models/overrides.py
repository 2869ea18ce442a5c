"""Single-fire overrides: one fire of a schedule skipped, or moved to another time, this
once (``Schedule.skip_fire()``, ``Schedule.move_fire()``; docs/overrides.md). A moved fire
is keyed in the ledger by its original plan time, so it can never run twice.

Overriding single fires: ``Schedule.skip_fire()``, ``move_fire()`` and
``clear_override()``, the methods of the ``Overriding`` mixin.

An override names a real fire of the schedule (one its trigger gives and its calendars
let run). Made before its fire is planned, it is stored and the cursor moves to the
schedule's first effective time from where it was (``timing/overridden.py``): a fire moved
earlier is planned in time. Made when its fire was planned but its run has not started, it
also changes that run at once, in the same transaction (the ledger's ``override_runs``).
A fire whose run started or ended, or that passed without being planned, is refused.
"""

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic import choices, db
from django_periodic.choices import OverrideAction
from django_periodic.db import announcements, clock
from django_periodic.models.calendars import closures_of
from django_periodic.models.run import RunQuerySet
from django_periodic.models.schedule_fields import ScheduleFields
from django_periodic.models.trigger_rows import open_trigger_of, planning_trigger_of
from django_periodic.timing import bounds, overridden, triggers


class FireOverride(models.Model):
    """One fire of a schedule, at ``plan_time``, skipped or moved to ``move_to``."""

    Action = OverrideAction

    schedule = models.ForeignKey(
        "django_periodic.Schedule", on_delete=models.CASCADE, related_name="overrides"
    )
    plan_time = models.DateTimeField(help_text=_("The fire it overrides, as its trigger gives it."))
    action = models.CharField(max_length=8, choices=OverrideAction)
    move_to = models.DateTimeField(
        null=True, blank=True, help_text=_("A moved fire: when it runs instead.")
    )
    reason = models.CharField(max_length=500)
    by = models.CharField(max_length=150, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now())

    class Meta:
        ordering = ["schedule", "plan_time"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "plan_time"], name="periodic_override_one_per_fire"
            ),
            # A move names where to; a skip does not.
            models.CheckConstraint(
                condition=(Q(action=OverrideAction.MOVE) & Q(move_to__isnull=False))
                | (Q(action=OverrideAction.SKIP) & Q(move_to__isnull=True)),
                name="periodic_override_move_to",
            ),
            models.CheckConstraint(
                condition=Q(action__in=OverrideAction.values), name="periodic_override_action"
            ),
            models.CheckConstraint(
                condition=Q(plan_time__gte=bounds.EARLIEST, plan_time__lt=bounds.LATEST)
                & (
                    Q(move_to__isnull=True)
                    | Q(move_to__gte=bounds.EARLIEST, move_to__lt=bounds.LATEST)
                ),
                name="periodic_override_times_range",
            ),
        ]

    def __str__(self) -> str:
        if self.action == OverrideAction.MOVE:
            return f"{self.plan_time:%Y-%m-%d %H:%M} moved to {self.move_to:%Y-%m-%d %H:%M}"
        return f"{self.plan_time:%Y-%m-%d %H:%M} skipped"

    def clean(self) -> None:
        """Its times within the range every stored time keeps (``bounds.TIMES``), as its
        CHECK constraint has them: out of it, a time cannot even be converted to UTC."""
        errors = {
            name: message
            for name in ("plan_time", "move_to")
            if (message := bounds.TIMES.error(name, getattr(self, name)))
        }
        if errors:
            raise ValidationError(errors)

    @property
    def at(self) -> datetime:
        """Where its fire runs: its new time if moved, else its plan time."""
        return self.move_to or self.plan_time


REASON_MAX_LENGTH = 500
_MICROSECOND = timedelta(microseconds=1)
_NOT_STARTED = (choices.RunStatus.PENDING, choices.RunStatus.QUEUED)


class Overriding(ScheduleFields):
    """Single fires skipped or moved (docs/overrides.md): ``skip_fire()``, ``move_fire()``,
    ``clear_override()``."""

    class Meta:
        abstract = True

    def skip_fire(self, plan_time: datetime, reason: str, by: str = "") -> FireOverride:
        """Skip the fire at ``plan_time``: it records one skipped run (code ``overridden``)
        whose message names who skipped it and why. Raises ValidationError for a time that is
        not a fire of the schedule, a fire already started or past, or no reason."""
        override = FireOverride(plan_time=plan_time, reason=reason, by=by)
        override.action = FireOverride.Action.SKIP
        return _override(self, override)

    def move_fire(
        self, plan_time: datetime, to: datetime, reason: str, by: str = ""
    ) -> FireOverride:
        """Run the fire at ``plan_time`` once at ``to`` instead; its run keeps ``plan_time``
        (so it can never run twice) and is released at ``to``. ``to`` must be in the future,
        within ``MAX_MOVE`` (7 days) of the plan time and strictly between the fires before and
        after it, where they run. Raises ValidationError otherwise, as ``skip_fire()`` does."""
        override = FireOverride(plan_time=plan_time, reason=reason, by=by)
        override.action, override.move_to = FireOverride.Action.MOVE, to
        return _override(self, override)

    def clear_override(self, plan_time: datetime) -> None:
        """Remove the override of the fire at ``plan_time`` before its fire is planned: the
        fire runs at its own time again (if that has passed, its misfire policy decides).
        Raises ValidationError when there is none, or its fire was planned already: the
        override then stays, as the history of its run."""
        using = self._state.db or "default"
        FireOverride(plan_time=plan_time).clean()  # a time it could be
        with transaction.atomic(using=using):
            locked = _locked(self, using)
            found = locked.overrides.filter(plan_time=plan_time).first()
            if found is None:
                raise ValidationError(
                    {"plan_time": f"No override of the fire at {_shown(plan_time)}."}
                )
            if run := _runs(locked, plan_time).first():
                raise ValidationError(
                    {"plan_time": f"Its fire was planned (run {run.pk}, {run.status}): it stays."}
                )
            found.delete()
            _move_cursor(locked, min(plan_time, found.at), using)
        self.next_fire_at = locked.next_fire_at
        announcements.notify(using)  # wake the schedulers


def _override(schedule: ScheduleFields, override: FireOverride) -> FireOverride:
    using = schedule._state.db or "default"
    now = clock.now(using)
    _check_values(override)
    with transaction.atomic(using=using):
        locked = _locked(schedule, using)
        # The mixin's row is a Schedule, the model the key names.
        override.schedule = locked  # type: ignore[assignment]
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
    announcements.notify(using)  # wake the schedulers
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


def _locked(schedule: ScheduleFields, using: str) -> ScheduleFields:
    """The schedule's row, locked: the planner skips it meanwhile (SKIP LOCKED)."""
    return type(schedule)._default_manager.using(using).select_for_update().get(pk=schedule.pk)


def _runs(schedule: ScheduleFields, plan_time: datetime) -> RunQuerySet:
    """The ledger's runs of the fire at ``plan_time`` (one per scope)."""
    runs: RunQuerySet = schedule.runs.all()
    return runs.filter(trigger__in=choices.LEDGER_TRIGGERS, plan_time=plan_time)


def _checked_fire(schedule: ScheduleFields, plan_time: datetime, now: datetime) -> triggers.Trigger:
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
    statuses: list[tuple[str, int]], schedule: ScheduleFields, override: FireOverride, now: datetime
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
    schedule: ScheduleFields, trigger: triggers.Trigger, plan_time: datetime
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


def _move_cursor(schedule: ScheduleFields, since: datetime, using: str) -> None:
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
        type(schedule)._default_manager.using(using).filter(pk=schedule.pk).update(
            next_fire_at=moved
        )
        schedule.next_fire_at = moved


def _shown(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
