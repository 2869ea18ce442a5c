"""The ledger: schedules, the runs they fire, and the leases under which runs execute.

Models only: fields, constraints, the queryset vocabulary (``due``, ``claimable``,
``waiting``, ...), validation, and thin documented methods that call the engine. Every
name below is importable from ``django_periodic.models``.
"""

from django_periodic.models.calendars import Calendar, closures_from, closures_of
from django_periodic.models.explaining.accounts import FireAccount, FireStatus
from django_periodic.models.explaining.pages import ExplainPage
from django_periodic.models.overrides import FireOverride
from django_periodic.models.processes import (
    Lease,
    LeaseQuerySet,
    SchedulerProcess,
    SchedulerProcessQuerySet,
)
from django_periodic.models.restoring import restore_version
from django_periodic.models.run import (
    AWAITING_RELEASE,
    BACKFILLED,
    CLAIMABLE_STATUSES,
    RELEASE,
    SNAPSHOT_FIELDS,
    Run,
    RunQuerySet,
)
from django_periodic.models.schedule import Schedule, ScheduleQuerySet
from django_periodic.models.schedule_fields import (
    ALERT_FIELDS,
    ATTENTION_FIELDS,
    CALENDAR_FIELDS,
    CURSOR_FIELDS,
    JOB_FIELDS,
    LIFECYCLE_FIELDS,
    OWN_RETENTION,
    PING_FIELDS,
    POLICY_FIELDS,
    RETENTION_FIELDS,
    REVISION_FIELDS,
    SCHEDULE_OPTIONS,
    SECRET_FIELDS,
    TRIGGER_FIELDS,
    VERSIONED_FIELDS,
    default_timezone,
)
from django_periodic.models.trigger_rows import (
    ANCHORED_AT_CREATION,
    KIND_FIELDS,
    KIND_FILTERS,
    TriggerRow,
    first_fire_time_of,
    kind_of,
    next_fire_times_of,
    open_trigger_of,
    planning_trigger_of,
    trigger_field_errors,
    trigger_of,
)
from django_periodic.models.versions import ScheduleVersion, changed_by

__all__ = [
    "ALERT_FIELDS",
    "ANCHORED_AT_CREATION",
    "ATTENTION_FIELDS",
    "AWAITING_RELEASE",
    "BACKFILLED",
    "CALENDAR_FIELDS",
    "CLAIMABLE_STATUSES",
    "CURSOR_FIELDS",
    "JOB_FIELDS",
    "KIND_FIELDS",
    "KIND_FILTERS",
    "LIFECYCLE_FIELDS",
    "OWN_RETENTION",
    "PING_FIELDS",
    "POLICY_FIELDS",
    "RELEASE",
    "RETENTION_FIELDS",
    "REVISION_FIELDS",
    "SCHEDULE_OPTIONS",
    "SECRET_FIELDS",
    "SNAPSHOT_FIELDS",
    "TRIGGER_FIELDS",
    "VERSIONED_FIELDS",
    "Calendar",
    "ExplainPage",
    "FireAccount",
    "FireOverride",
    "FireStatus",
    "Lease",
    "LeaseQuerySet",
    "Run",
    "RunQuerySet",
    "Schedule",
    "ScheduleQuerySet",
    "ScheduleVersion",
    "SchedulerProcess",
    "SchedulerProcessQuerySet",
    "TriggerRow",
    "changed_by",
    "closures_from",
    "closures_of",
    "default_timezone",
    "first_fire_time_of",
    "kind_of",
    "next_fire_times_of",
    "open_trigger_of",
    "planning_trigger_of",
    "restore_version",
    "trigger_field_errors",
    "trigger_of",
]
