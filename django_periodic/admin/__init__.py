"""The scheduling console: schedules, runs, calendars, concurrency limits, leases and scheduler
processes in the Django admin.

Importing this module (the admin's autodiscovery does) registers the six ModelAdmins.
"""

from django_periodic.admin.calendars import CalendarAdmin
from django_periodic.admin.limits import ConcurrencyLimitAdmin
from django_periodic.admin.processes import LeaseAdmin, SchedulerProcessAdmin
from django_periodic.admin.runs import RunAdmin
from django_periodic.admin.schedules import ScheduleAdmin

__all__ = [
    "CalendarAdmin",
    "ConcurrencyLimitAdmin",
    "LeaseAdmin",
    "RunAdmin",
    "ScheduleAdmin",
    "SchedulerProcessAdmin",
]
