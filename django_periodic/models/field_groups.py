"""Schedule fields by role: the admin's form and fieldsets, ``@job`` and the sync of
code-defined schedules, saving (cursor, revision) and validation all read them from here."""

JOB_FIELDS = ("args", "kwargs", "scopes")
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
)
# How long a schedule's finished runs are kept (retention.py); empty: the global settings.
RETENTION_FIELDS = ("keep_runs", "keep_runs_for", "keep_failed_runs_for")
# When a schedule needs attention (alerting.py); empty: never for that reason.
ALERT_FIELDS = ("alert_after", "alert_failures")
# Who is told from outside when its runs start and end (operations/pings.py, docs/pings.md).
PING_FIELDS = ("ping_url",)
# Fields that hold secrets (a ping URL embeds its check's key): never shown to a user who
# may not change the schedule, never logged, recorded by versions as a fingerprint only
# (models/changes/versioning.py), and left as they are when a version is restored.
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
# What a version of a schedule records (models/changes/versioning.py): every field a user
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
