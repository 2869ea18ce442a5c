"""Schedules: when and how a registered job runs, and the cursor the planner moves."""

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic import choices
from django_periodic.choices import AttentionReason, ScheduleKind
from django_periodic.db import clock
from django_periodic.models import alerting, extra_runs, lifecycle, pausing, saving, validation
from django_periodic.models.calendars import closures_of
from django_periodic.models.changes import overriding, versioning
from django_periodic.models.explaining import explain as explaining
from django_periodic.models.explaining import fire_diff as diffing
from django_periodic.models.field_groups import CURSOR_FIELDS, PING_FIELDS
from django_periodic.models.lifecycle import Lifecycle
from django_periodic.models.pausing import PAUSE_REASON_MAX_LENGTH
from django_periodic.models.schedule_queries import ScheduleQuerySet
from django_periodic.models.tracking import TrackedChanges
from django_periodic.models.trigger_rows import (
    first_fire_time_of,
    kind_of,
    open_trigger_of,
    trigger_of,
)
from django_periodic.timing import bounds, triggers


def default_timezone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or "UTC"


class Schedule(TrackedChanges, Lifecycle, alerting.Alerting):
    """When and how a registered job runs; exactly one trigger: cron, interval, run_at or rrule."""

    Kind = ScheduleKind

    Overlap = choices.Overlap
    Misfire = choices.Misfire

    name = models.CharField(max_length=200)  # unique: see Meta.constraints
    job = models.CharField(max_length=200, help_text=_("Name of a registered @job."))
    args = models.JSONField(default=list, db_default=[], blank=True)
    kwargs = models.JSONField(default=dict, db_default={}, blank=True)
    scopes = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text=_("A registered scope provider: each fire runs once per scope key it returns."),
    )

    cron = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text=_("5-field cron or @daily."),
    )
    timezone = models.CharField(max_length=64, default=default_timezone)
    dst_gap = models.CharField(
        max_length=16,
        choices=choices.DstGap,
        blank=True,
        default="",
        db_default="",
        help_text=_("Cron: a fire a spring-forward change skips; empty: as cron(8) does."),
    )
    dst_repeat = models.CharField(
        max_length=16,
        choices=choices.DstRepeat,
        blank=True,
        default="",
        db_default="",
        help_text=_("Cron: a fire a fall-back change repeats; empty: as cron(8) does."),
    )
    rrule = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "RFC 5545 recurrence: an RRULE line, with optional EXDATE and RDATE lines, in its "
            "time zone, anchored at start_at."
        ),
    )
    interval = models.DurationField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True, help_text=_("Fire once at this time."))
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)

    calendars = models.ManyToManyField(
        "django_periodic.Calendar",
        blank=True,
        related_name="schedules",
        help_text=_("Its fires on the days these close, or in their blackouts, do not run."),
    )
    on_closed_day = models.CharField(
        max_length=20,
        choices=choices.OnClosedDay,
        default=choices.OnClosedDay.SKIP,
        db_default=choices.OnClosedDay.SKIP,
        help_text=_("A fire on a closed day: skipped, or run on the next or previous open day."),
    )

    enabled = models.BooleanField(default=True, db_default=True)
    # A pause (pause()): its fires before paused_until are not run. Set by the admin's
    # "Pause…" and pause(), not by the schedule's form.
    paused_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("Its fires before then are not run; empty: not paused."),
    )
    pause_reason = models.CharField(
        max_length=PAUSE_REASON_MAX_LENGTH, blank=True, default="", db_default="", editable=False
    )
    paused_by = models.CharField(
        max_length=150, blank=True, default="", db_default="", editable=False
    )
    overlap = models.CharField(
        max_length=16, choices=Overlap, default=Overlap.SKIP, db_default=Overlap.SKIP
    )
    max_queued = models.PositiveIntegerField(
        default=1,
        db_default=1,
        help_text=_("With overlap “queue”: fires that may wait; more are skipped."),
    )
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("With overlap “concurrent”: most runs active at once; empty for no limit."),
    )
    misfire = models.CharField(
        max_length=16, choices=Misfire, default=Misfire.LATEST, db_default=Misfire.LATEST
    )
    misfire_grace = models.DurationField(
        default=timedelta(minutes=1), db_default=timedelta(minutes=1)
    )
    jitter = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "Stagger: each run starts up to this long after its plan time, at an offset "
            "fixed by the schedule, scope and plan time; empty: at its plan time."
        ),
    )
    max_attempts = models.PositiveIntegerField(default=1, db_default=1)
    retry_backoff = models.DurationField(
        default=timedelta(seconds=10),
        db_default=timedelta(seconds=10),
        help_text=_("Delay before the first retry; doubles after."),
    )
    timeout = models.DurationField(null=True, blank=True)
    lease_timeout = models.DurationField(
        default=timedelta(seconds=30), db_default=timedelta(seconds=30)
    )
    allow_stale_reentry = models.BooleanField(
        default=False,
        db_default=False,
        help_text=_("Run again when the process running it died (at-least-once)."),
    )
    tasks_backend = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "A TASKS backend alias whose workers execute its runs; empty: the "
            "DJANGO_PERIODIC TASKS_BACKEND setting (none: run_scheduler's own workers)."
        ),
    )

    keep_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Keep at least its last N finished runs; empty: the KEEP_RUNS setting."),
    )
    keep_runs_for = models.DurationField(
        null=True,
        blank=True,
        help_text=_("Keep finished runs planned this recently; empty: the KEEP_RUNS_FOR setting."),
    )
    keep_failed_runs_for = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "Keep failed runs planned this recently; empty: the KEEP_FAILED_RUNS_FOR setting."
        ),
    )

    # alert_after, alert_failures and ping_url: models/alerting.py (Alerting).
    # Whether it needs attention, as the scheduler last found
    # (engine/planning/attention.py); only the scheduler writes them.
    attention_reason = models.CharField(
        max_length=32,
        choices=AttentionReason,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("Why it needs attention; empty: it does not."),
    )
    attention_since = models.DateTimeField(null=True, blank=True, editable=False)

    revision = models.PositiveIntegerField(
        default=1,
        db_default=1,
        editable=False,
        help_text=_("Bumped when its trigger, job or arguments change; each run records it."),
    )
    # The cursor; NULL: no next fire. A row stored without save() gets UNPLANNED from the
    # database, and is planned from its trigger (is_unplanned).
    next_fire_at = models.DateTimeField(
        null=True, blank=True, editable=False, db_default=bounds.UNPLANNED
    )
    last_error = models.TextField(blank=True, default="", db_default="", editable=False)
    planning_failures = models.PositiveIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text=_("Consecutive ticks that could not plan it."),
    )
    job_unknown_since = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "Since when no live process has had its job (a rolling deploy under way, or a "
            "job removed); past UNKNOWN_JOB_GRACE the planners disable it."
        ),
    )
    defined_in = models.CharField(
        max_length=300,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("Code location of a @job schedule."),
    )
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True, db_default=Now())

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
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        update_fields = kwargs.get("update_fields")
        fires_once = lifecycle.fires_on_save(self, update_fields)  # fire_on_create
        touches_trigger = update_fields is None or set(update_fields) & set(CURSOR_FIELDS)
        moved = touches_trigger and saving.move_cursor(self, kwargs.get("using") or "default")
        if moved and update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "next_fire_at"}
        revised = self._revised(update_fields)
        if revised:
            # In the UPDATE itself, so that two concurrent edits make two revisions.
            self.revision = F("revision") + 1
            if update_fields is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "revision"}
        if update_fields is None and not args and saving.writes_every_field(self, kwargs):
            kwargs["update_fields"] = saving.edited_fields(self)
        with versioning.recording(self, kwargs):  # a version of what it changes
            super().save(*args, **kwargs)
            if revised:
                saved = Schedule.objects.using(self._state.db).filter(pk=self.pk)
                self.revision = saved.values_list("revision", flat=True).get()
        self._remember_saved(update_fields)
        if moved:
            # Sleeping schedulers look at the new cursor.
            saving.wake_schedulers(self._state.db or "default")
        if fires_once:
            lifecycle.fire_once(self)

    @property
    def trigger_kind(self) -> str:
        """The ``Schedule.Kind`` of the trigger ("" if none is set)."""
        return kind_of(self)

    @property
    def is_unplanned(self) -> bool:
        """Stored without save() (``bulk_create()``, raw SQL, a fixture): its cursor is the
        database's default, ``bounds.UNPLANNED``, until the planner plans it from its trigger."""
        return self.next_fire_at == bounds.UNPLANNED

    @property
    def is_code_defined(self) -> bool:
        return bool(self.defined_in)

    @property
    def trigger(self) -> triggers.Trigger:
        """The schedule's fire times as a pure trigger; raises InvalidTrigger for a bad row."""
        return trigger_of(self)

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
        trigger = open_trigger_of(self, closures_of(self))
        return triggers.fire_times(trigger, n, after or clock.wall_now())

    # Pausing and resuming (docs/pause.md): defined in models/pausing.py, set here by name.
    pause = pausing.pause
    resume = pausing.resume
    # Single fires skipped or moved (docs/overrides.md): in models/changes/overriding.py.
    skip_fire = overriding.skip_fire
    move_fire = overriding.move_fire
    clear_override = overriding.clear_override

    @property
    def attention_note(self) -> str:
        """Why it needs attention, in words ("" if it does not)."""
        if not self.attention_reason:
            return ""
        return alerting.note(self.attention_reason, self.alert_after, self.alert_failures)

    def is_paused(self, now: datetime) -> bool:
        """Whether a pause holds its fires at ``now``."""
        return pausing.holds(self.paused_until, now)

    # The runs it records on request (manual, backfill, extra), through the engine: defined
    # in models/extra_runs.py, set here by name.
    run_now = extra_runs.run_now
    run_now_for_all_scopes = extra_runs.run_now_for_all_scopes
    backfill = extra_runs.backfill
    plan_extra_run = extra_runs.plan_extra_run
    plan_extra_runs = extra_runs.plan_extra_runs

    # What became of its fires, and what a change would do to them (docs/explain.md):
    # defined in models/explaining/, set here by name.
    explain = explaining.explain
    explain_page = explaining.explain_page
    fire_diff = diffing.fire_diff

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
