"""Schedules: when and how a registered job runs, and the cursor the planner moves.

``Schedule`` is its fields (models/schedule_fields.py) and the mixins that give it its
behaviour, each in the module of its concept: pausing (models/pausing.py), single fires
skipped or moved (models/overrides.py), what became of its fires and what a change would do
to them (models/explaining/), the runs it records on request (models/extra_runs.py), what
it remembers of its row (models/versions.py). Here: the concrete model, its constraints,
its queryset vocabulary, and what saving one does besides writing its row: where the cursor
moves, which fields a whole-row save writes, its fire on creation, and waking the
schedulers.
"""

import logging
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from django_periodic.choices import LEDGER_FORMAT, ScheduleKind
from django_periodic.db import announcements, clock
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped
from django_periodic.models import alerting, pausing, trigger_rows, validation, versions
from django_periodic.models.calendars import closures_of
from django_periodic.models.explaining.explain import Explaining
from django_periodic.models.explaining.fire_diff import Diffing
from django_periodic.models.extra_runs import ExtraRuns
from django_periodic.models.overrides import Overriding
from django_periodic.models.pausing import Pausing
from django_periodic.models.schedule_fields import (
    ATTENTION_FIELDS,
    CURSOR_FIELDS,
    OWN_RETENTION,
    PING_FIELDS,
    RETENTION_FIELDS,
    REVISION_FIELDS,
    ScheduleFields,
)
from django_periodic.models.trigger_rows import KIND_FILTERS, first_fire_time_of, next_fire_times_of
from django_periodic.models.versions import TrackedChanges
from django_periodic.timing import bounds, stagger, triggers

logger = logging.getLogger("django_periodic")


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def enabled(self) -> "ScheduleQuerySet":
        """Schedules the planner looks at: not paused or disabled, and readable."""
        return self.filter(enabled=True).readable()

    def readable(self) -> "ScheduleQuerySet":
        """Schedules of a ledger format this release reads (``choices.LEDGER_FORMAT``): the
        planning and judging passes leave the others alone, to the release that wrote them."""
        return self.filter(ledger_format__lte=LEDGER_FORMAT)

    def with_alerts(self) -> "ScheduleQuerySet":
        """Schedules whose alerts the scheduler judges: enabled, with at least one set."""
        return self.filter(alerting.WITH_ALERTS)

    def paused(self, now: datetime) -> "ScheduleQuerySet":
        """Schedules a pause holds at ``now`` (``Schedule.is_paused``, models/pausing.py)."""
        return self.filter(pausing.paused(now))

    def needing_attention(self) -> "ScheduleQuerySet":
        """Schedules the scheduler last found needing attention (models/alerting.py)."""
        return self.exclude(attention_reason="")

    def of_kind(self, kind: str) -> "ScheduleQuerySet":
        """Schedules whose trigger is of this ``Schedule.Kind``."""
        return self.filter(KIND_FILTERS[ScheduleKind(kind)])

    def downstream(self) -> "ScheduleQuerySet":
        """Schedules that fire after others (``after``) instead of on a clock."""
        return self.filter(trigger_rows.DOWNSTREAM)

    def due(self, now: datetime) -> "ScheduleQuerySet":
        """Enabled schedules whose cursor has reached ``now``, the most overdue first."""
        return self.enabled().filter(next_fire_at__lte=now).order_by("next_fire_at", "pk")

    def update(self, **kwargs: Any) -> int:
        """Update these rows; writing any of ``REVISION_FIELDS`` bumps their revision.

        Bumped in the same statement, changed value or not (the database would have to
        compare every field to tell), so ``bulk_update()`` of those fields bumps too.
        """
        if "revision" not in kwargs and not kwargs.keys().isdisjoint(REVISION_FIELDS):
            kwargs["revision"] = F("revision") + 1
        return super().update(**kwargs)

    def update_versioned(
        self, *, by: str | None = None, reason: str | None = None, **values: Any
    ) -> int:
        """``update(**values)`` that records a version of each row it changes
        (docs/versions.md; ``versions.update_versioned``)."""
        return versions.update_versioned(self, by=by, reason=reason, **values)

    def reschedule(self, now: datetime | None = None) -> int:
        """Recompute the cursor of these schedules from ``now`` (after edits that bypass save())."""
        now = now or clock.now(self.db)
        changed = []
        for schedule in self.prefetch_related("calendars").iterator(chunk_size=2000):
            if schedule.trigger_kind == ScheduleKind.ONCE and schedule.next_fire_at is None:
                continue  # a fired one-shot stays fired
            # One that has run its max_runs fires stays ended (models/schedule_fields.py).
            schedule.next_fire_at = None if schedule.has_ended else schedule.first_fire_time(now)
            changed.append(schedule)
        updated = self.model.objects.using(self.db).bulk_update(changed, ["next_fire_at"])
        if updated:
            wake_schedulers(self.db)
        return updated


class Schedule(TrackedChanges, Pausing, Overriding, Explaining, Diffing, ExtraRuns, ScheduleFields):
    """When and how a registered job runs; one trigger: cron, interval, run_at, rrule or after.

    Its fields: models/schedule_fields.py; its behaviour: the mixins named above."""

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            # A constraint, not unique=True, which on PostgreSQL adds a varchar_pattern_ops
            # index for LIKE 'prefix%' that no query here uses, and that every cursor move
            # (a non-HOT update) had to write: one index in four.
            models.UniqueConstraint(fields=["name"], name="periodic_schedule_name_unique"),
            *validation.range_constraints(),
        ]
        indexes = [
            # In due()'s order (cursor, then id), so a batch reads its rows off the index;
            # on the cursor alone every batch sorted every due row to take the first ones.
            models.Index(
                fields=["next_fire_at", "id"],
                condition=Q(enabled=True),
                name="periodic_schedule_due",
            ),
            # The few the attention pass reads (alerting.JUDGED): it reads these, never
            # every row. Partial: a row outside it, however often its cursor moves, writes
            # nothing to it.
            models.Index(fields=["id"], condition=alerting.JUDGED, name="periodic_schedule_judged"),
            # The schedules with retention rules of their own, whose distinct rules a
            # retention pass reads (operations/prunable.py); partial, as the one above.
            models.Index(
                fields=list(RETENTION_FIELDS),
                condition=OWN_RETENTION,
                name="periodic_schedule_retention",
            ),
            # The enabled downstream schedules, which the pass planning runs after runs
            # reads (engine/planning/after.py): a schedule on a clock costs it nothing.
            models.Index(
                fields=["id"],
                condition=trigger_rows.DOWNSTREAM & Q(enabled=True),
                name="periodic_schedule_downstream",
            ),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        update_fields = kwargs.get("update_fields")
        fires_once = fires_on_save(self, update_fields)  # fire_on_create
        touches_trigger = update_fields is None or set(update_fields) & set(CURSOR_FIELDS)
        moved = touches_trigger and move_cursor(self, kwargs.get("using") or "default")
        if moved and update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "next_fire_at"}
        revised = self._revised(update_fields)
        if revised:
            # In the UPDATE itself, so that two concurrent edits make two revisions.
            self.revision = F("revision") + 1
            if update_fields is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "revision"}
        if update_fields is None and not args and writes_every_field(self, kwargs):
            kwargs["update_fields"] = edited_fields(self)
        with versions.recording(self, kwargs):  # a version of what it changes
            super().save(*args, **kwargs)
            if revised:
                saved = Schedule.objects.using(self._state.db).filter(pk=self.pk)
                self.revision = saved.values_list("revision", flat=True).get()
        self._remember_saved(update_fields)
        if moved:
            # Sleeping schedulers look at the new cursor.
            wake_schedulers(self._state.db or "default")
        if fires_once:
            fire_once(self)

    def first_fire_time(self, now: datetime) -> datetime | None:
        """The cursor of a new or re-triggered schedule: the first fire after ``now``
        (``first_fire_time_of``), under its calendars.

        A calendar that cannot be used is left out here, so that saving this schedule (or
        a calendar it shares) still works; the planner fails the schedule with the
        calendar's error when it is due."""
        try:
            closures = closures_of(self)
        except triggers.InvalidTrigger:
            closures = None
        return first_fire_time_of(self, now, closures)

    def next_fire_times(self, n: int, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` fire times strictly after ``after`` (default: now), aware UTC: the
        fires that run, its calendars' closed fires left out or shifted (docs/calendars.md)."""
        return next_fire_times_of(self, closures_of(self), n, after or clock.wall_now())

    def release_time(self, plan_time: datetime, scope: str = "") -> datetime:
        """When this schedule's run for ``scope`` at ``plan_time`` may start: its plan time,
        later by a share of ``jitter`` fixed by the schedule's id, the scope and the plan
        time, the same in every process (docs/stagger.md)."""
        return stagger.release_time(self.jitter, self.pk, scope, plan_time) or plan_time

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        for field, message in validation.schedule_errors(self):
            errors.setdefault(field, []).append(message)
        if errors:
            raise ValidationError(errors)

    def validate_constraints(self, exclude: Collection[str] | None = None) -> None:
        # clean() checks the ranges of bounds.SCHEDULE, the RRULE's length and the ping
        # URL's scheme, the CHECK constraints' own, with a message on the field; Django
        # would run one query per CHECK to say it again.
        checked = {*bounds.SCHEDULE, "rrule", *PING_FIELDS}
        super().validate_constraints(exclude={*(exclude or ()), *checked})


def wake_schedulers(using: str) -> None:
    """Tell sleeping schedulers that a cursor moved (a NOTIFY on PostgreSQL, on commit)."""
    announcements.notify(using)


def writes_every_field(schedule: Schedule, kwargs: dict[str, Any]) -> bool:
    """Whether a save with these ``kwargs`` would UPDATE every field of the existing row."""
    same_database = kwargs.get("using") in (None, schedule._state.db)
    return not schedule._state.adding and same_database and not kwargs.get("force_insert")


def edited_fields(schedule: Schedule) -> list[str]:
    """Every loaded field but ``ATTENTION_FIELDS``, which only the scheduler writes: an
    edit saved from a form loaded before a transition must not undo it."""
    deferred = schedule.get_deferred_fields()
    return [
        field.name
        for field in schedule._meta.concrete_fields
        if not field.primary_key
        and field.name not in ATTENTION_FIELDS
        and field.attname not in deferred
    ]


def move_cursor(schedule: Schedule, using: str) -> bool:
    """Set ``next_fire_at`` after a change that affects it; return whether it moved.

    A new schedule, an edited trigger and a resumed schedule (enabled again, or its
    pause ended) restart from now (time spent paused is not a misfire). Disabling and
    pausing keep the cursor, and a one-shot keeps it unless ``run_at`` changed, so that
    a fired one-shot can never fire again. One that has run its ``max_runs`` fires has
    none (models/schedule_fields.py); raising or clearing ``max_runs`` resumes it from now.
    """
    changed = schedule._changed_cursor_fields()
    if not schedule._state.adding:
        if not changed or (changed == {"enabled"} and not schedule.enabled):
            return False
        if changed == {"paused_until"} and schedule.paused_until is not None:
            return False  # pausing: the planner skips the fires of the pause
        if schedule.trigger_kind == ScheduleKind.ONCE and "run_at" not in changed:
            return False
        going_on = schedule.next_fire_at is not None and not schedule.has_ended
        if changed == {"max_runs"} and going_on:
            return False  # a new limit not reached yet: its fires go on as planned
    now = clock.now(using)
    if schedule._state.adding:
        schedule.created_at = now  # an interval's anchor: the database's clock, like all times
    schedule.next_fire_at = None if schedule.has_ended else schedule.first_fire_time(now)
    return True


def fires_on_save(schedule: Schedule, update_fields: Iterable[str] | None) -> bool:
    """Whether this save fires it once (``fire_on_create``): it is new, or enabled again
    (``enabled`` written, False before), and it is enabled and has not ended. Read
    before the save, which forgets what the row held."""
    if not (schedule.fire_on_create and schedule.enabled) or schedule.has_ended:
        return False
    if schedule._state.adding:
        return True
    if update_fields is not None and "enabled" not in update_fields:
        return False
    loaded = getattr(schedule, "_loaded_trigger", None) or {}
    return loaded.get("enabled") is False


def fire_once(schedule: Schedule) -> None:
    """The fire of ``fire_on_create``: a manual run now (``run_now()``; every scope of a
    fanned-out schedule), under its overlap policy. A manual run is not one of the
    trigger's plan times, so it never takes one's place, and ``max_runs`` does not count
    it. A scope provider that fails is logged: the schedule is saved all the same."""
    try:
        schedule.run_now_for_all_scopes()
    except Exception as exc:  # app code (a scope provider): the save stands
        message = escaped(error_text(exc))
        logger.error("Schedule %r did not fire on creation: %s", schedule.name, message)
