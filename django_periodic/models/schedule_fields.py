"""A schedule's row: its fields, and what reads from them alone (its trigger, its kind).

``ScheduleFields`` is the abstract base of ``Schedule`` and of the mixins that give it its
behaviour (pausing, overrides, explain, the runs it records on request): each of them, and
each rule that reads a schedule, names this class, so that none imports ``Schedule`` back.
The concrete model, its queryset, its constraints and what its save does are in
models/schedule.py.

Its fields by role (``TRIGGER_FIELDS``, ``CURSOR_FIELDS``, ...): the admin's form and
fieldsets, ``@job`` and the sync of code-defined schedules, saving (cursor, revision) and
validation all read them from here.
"""

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic import choices
from django_periodic.choices import AttentionReason, ScheduleKind
from django_periodic.db import clock
from django_periodic.models import alerting
from django_periodic.models.trigger_rows import kind_of, trigger_of
from django_periodic.timing import bounds, triggers

JOB_FIELDS = ("args", "kwargs", "scopes")
# A schedule that fires after others instead of on a clock (engine/planning/after.py,
# docs/dependencies.md): the names of its upstreams, what their runs must end in, and how
# long it waits for them from a plan time. Trigger fields: set, they are its trigger.
AFTER_FIELDS = ("after", "after_outcome", "after_wait")
TRIGGER_FIELDS = (
    "cron",
    "timezone",
    "dst_gap",
    "dst_repeat",
    "interval",
    "run_at",
    "rrule",
    "start_at",
    "end_at",
    *AFTER_FIELDS,
)
POLICY_FIELDS = (
    "overlap",
    "max_queued",
    "max_concurrent",
    "misfire",
    "misfire_grace",
    "jitter",
    "max_attempts",
    "retry_backoff",
    "timeout",
    "lease_timeout",
    "allow_stale_reentry",
    "tasks_backend",
    "concurrency_limit",
)
# How long a schedule's finished runs are kept (retention.py); empty: the global settings.
RETENTION_FIELDS = ("keep_runs", "keep_runs_for", "keep_failed_runs_for")
# The schedules with a retention rule of their own: the condition of their index
# (periodic_schedule_retention), from which a retention pass reads their distinct rules
# without reading the schedules that follow the settings, however many there are.
OWN_RETENTION = (
    Q(keep_runs__isnull=False)
    | Q(keep_runs_for__isnull=False)
    | Q(keep_failed_runs_for__isnull=False)
)
# When a schedule needs attention (alerting.py); empty: never for that reason.
ALERT_FIELDS = ("alert_after", "alert_failures", "finish_within", "cancel_when_late")
# Who is told from outside when its runs start and end (operations/pings.py, docs/pings.md).
PING_FIELDS = ("ping_url",)
# Fields that hold secrets (a ping URL embeds its check's key): never shown to a user who
# may not change the schedule, never logged, recorded by versions as a fingerprint only
# (models/versions.py), and left as they are when a version is restored.
SECRET_FIELDS = ("ping_url",)
# When it ends, fires on creation, or pauses itself (docs/policies.md, "Lifecycle").
LIFECYCLE_FIELDS = ("max_runs", "fire_on_create", "pause_after_failures")
# What @job(...) may define besides its name: every field above.
SCHEDULE_OPTIONS = frozenset(
    JOB_FIELDS
    + TRIGGER_FIELDS
    + POLICY_FIELDS
    + RETENTION_FIELDS
    + ALERT_FIELDS
    + PING_FIELDS
    + LIFECYCLE_FIELDS
)
# The days it does not fire on (models/calendars.py), and what becomes of such a fire. Not
# options of @job: calendars are rows, edited in the admin.
CALENDAR_FIELDS = ("calendars", "on_closed_day")
# Fields whose change moves a schedule's cursor (next_fire_at) when saved (a change of its
# calendars moves it where they are saved: Calendar.save(), the admin's save_related()); a
# change of max_runs ends it, or resumes one that had ended.
CURSOR_FIELDS = (*TRIGGER_FIELDS, "on_closed_day", "enabled", "paused_until", "max_runs")
# Fields whose change makes a new revision of a schedule (Schedule.revision): what its
# runs call, and when.
REVISION_FIELDS = ("job", *JOB_FIELDS, *TRIGGER_FIELDS)
# A schedule's pause (Schedule.pause()): until when, why, by whom.
PAUSE_FIELDS = ("paused_until", "pause_reason", "paused_by")
# Whether it needs attention, as the scheduler last found (engine/planning/attention.py): written
# by the scheduler alone, never by a full save() (Schedule.save), so that an edit saved
# from a stale form cannot undo a transition and have it announced twice.
ATTENTION_FIELDS = ("attention_reason", "attention_since")
# What a version of a schedule records (models/versions.py): every field a user
# sets, through the admin, save(), @job, pause() or the importer. Never the scheduler's own
# (the cursor, attention, counters), whose writes make no version.
VERSIONED_FIELDS = (
    "name",
    "job",
    *JOB_FIELDS,
    "enabled",
    *TRIGGER_FIELDS,
    *CALENDAR_FIELDS,
    *POLICY_FIELDS,
    *RETENTION_FIELDS,
    *ALERT_FIELDS,
    *PING_FIELDS,
    *LIFECYCLE_FIELDS,
    *PAUSE_FIELDS,
)

PAUSE_REASON_MAX_LENGTH = 500


def default_timezone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or "UTC"


# A schedule's lifecycle (docs/policies.md, "Lifecycle"): when it ends (max_runs), whether
# it fires once on creation (fire_on_create) and when it pauses itself
# (pause_after_failures). How many fires it has left (runs_left) is read by more than one
# layer: the planner caps its decisions by it, save() ends or resumes its cursor by it,
# explain and the fire diff stop at it.
def runs_left(max_runs: int | None, fire_count: int) -> int | None:
    """How many more fires may run (0: it has ended); None: no limit."""
    return None if max_runs is None else max(max_runs - fire_count, 0)


class Lifecycle(models.Model):
    """The lifecycle fields of ``Schedule`` (``schedule_fields.LIFECYCLE_FIELDS``), and the
    count of fires that ``max_runs`` reads."""

    max_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("It stops after this many fires have run; empty: no limit."),
    )
    fire_count = models.PositiveIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text=_("Its fires planned to run so far, which max_runs counts."),
    )
    fire_on_create = models.BooleanField(
        default=False,
        db_default=False,
        help_text=_("A new or re-enabled schedule fires once at once."),
    )
    pause_after_failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("It pauses itself after this many failed runs in a row; empty: never."),
    )

    class Meta:
        abstract = True

    @property
    def has_ended(self) -> bool:
        """Whether it has run its ``max_runs`` fires: it has no next fire until
        ``max_runs`` is raised or cleared."""
        return runs_left(self.max_runs, self.fire_count) == 0

    @property
    def runs_note(self) -> str:
        """Its fires run so far, in words: "3 of 10 runs", "ended: ran 10 of 10 runs"."""
        if self.max_runs is None:
            return f"{self.fire_count} run(s)"
        counted = f"{self.fire_count} of {self.max_runs} runs"
        return f"ended: ran {counted}" if self.has_ended else counted


def ledger_format_field() -> "models.SmallIntegerField[int, int]":
    """The ledger format a process must read to handle the row (``choices.LEDGER_FORMAT``):
    a process of an older format leaves the row alone."""
    # Not Positive...: its CHECK would make adding the column scan the run table under an
    # exclusive lock, during a rolling deploy; a constant default alone changes no row.
    return models.SmallIntegerField(
        default=choices.LEDGER_FORMAT,
        db_default=choices.LEDGER_FORMAT,
        editable=False,
        help_text=_("The ledger format a process must read to handle it (mixed releases)."),
    )


class ScheduleFields(Lifecycle, alerting.Alerting):
    """The fields of ``Schedule``; exactly one trigger: cron, interval, run_at, rrule or after."""

    Kind = ScheduleKind

    Overlap = choices.Overlap
    Misfire = choices.Misfire

    name = models.CharField(max_length=200)  # unique: see Schedule.Meta.constraints
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
    after = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        help_text=_(
            'Names of the schedules it runs after, e.g. ["extract"]: it fires for each plan '
            "time they have all run for, instead of on a clock."
        ),
    )
    after_outcome = models.CharField(
        max_length=16,
        choices=choices.AfterOutcome,
        default=choices.AfterOutcome.SUCCEEDED,
        db_default=choices.AfterOutcome.SUCCEEDED,
        help_text=_("After: what its upstreams' runs must end in for it to fire."),
    )
    after_wait = models.DurationField(
        default=timedelta(hours=1),
        db_default=timedelta(hours=1),
        help_text=_(
            "After: how long from a plan time it waits for its upstreams; then that plan "
            "time is skipped, with the upstream that failed or was late."
        ),
    )
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
    # Its runs wait for a slot of this limit (models/limits.py); PROTECT: a limit that
    # schedules name cannot be deleted from under them.
    concurrency_limit = models.ForeignKey(
        "django_periodic.ConcurrencyLimit",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="schedules",
        help_text=_("Its runs take a slot of this limit, shared with the schedules naming it."),
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
    ledger_format = ledger_format_field()
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

    if TYPE_CHECKING:
        # The reverse relations of the concrete model, which the mixins read:
        # ``RunQuerySet`` and ``FireOverride`` rows (models/run.py, models/overrides.py).
        runs: Any
        overrides: Any

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.name

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
    def is_downstream(self) -> bool:
        """Whether it fires after other schedules (``after``) instead of on a clock."""
        return self.trigger_kind == ScheduleKind.AFTER

    @property
    def is_code_defined(self) -> bool:
        return bool(self.defined_in)

    @property
    def trigger(self) -> triggers.Trigger:
        """The schedule's fire times as a pure trigger; raises InvalidTrigger for a bad row."""
        return trigger_of(self)

    @property
    def attention_note(self) -> str:
        """Why it needs attention, in words ("" if it does not)."""
        if not self.attention_reason:
            return ""
        return alerting.note(
            self.attention_reason, self.alert_after, self.alert_failures, self.finish_within
        )
