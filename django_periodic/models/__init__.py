"""The ledger: schedules, the runs they fire, and the leases under which runs execute.

Models only: fields, constraints, the queryset vocabulary (``due``, ``claimable``,
``waiting``, ...), validation, and thin documented methods that call the engine. The names
below are the public ones (docs/api.md); the rest belongs to the modules that define it.
"""

from django_periodic.models.calendars import Calendar
from django_periodic.models.explaining.accounts import FireAccount, FireStatus
from django_periodic.models.explaining.pages import ExplainPage
from django_periodic.models.limits import ConcurrencyLimit, LimitVersion
from django_periodic.models.overrides import FireOverride
from django_periodic.models.pausing import UNTIL_RESUMED
from django_periodic.models.processes import (
    Lease,
    LeaseQuerySet,
    SchedulerProcess,
    SchedulerProcessQuerySet,
)
from django_periodic.models.restoring import restore_version
from django_periodic.models.run import Run, RunQuerySet
from django_periodic.models.schedule import Schedule, ScheduleQuerySet
from django_periodic.models.schedule_fields import default_timezone  # noqa: F401 (migration 0001)
from django_periodic.models.versions import ScheduleVersion, changed_by

__all__ = [
    "UNTIL_RESUMED",
    "Calendar",
    "ConcurrencyLimit",
    "ExplainPage",
    "FireAccount",
    "FireOverride",
    "FireStatus",
    "Lease",
    "LeaseQuerySet",
    "LimitVersion",
    "Run",
    "RunQuerySet",
    "Schedule",
    "ScheduleQuerySet",
    "ScheduleVersion",
    "SchedulerProcess",
    "SchedulerProcessQuerySet",
    "changed_by",
    "restore_version",
]
