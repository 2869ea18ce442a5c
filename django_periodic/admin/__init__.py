"""The scheduling console: schedules, runs, leases and scheduler processes in the Django admin.

Importing this module (the admin's autodiscovery does) registers the five ModelAdmins.
"""

from django_periodic.admin.calendars import CalendarAdmin
from django_periodic.admin.processes import LeaseAdmin, SchedulerProcessAdmin
from django_periodic.admin.runs import RunAdmin
from django_periodic.admin.schedules import ScheduleAdmin

__all__ = ["CalendarAdmin", "LeaseAdmin", "RunAdmin", "ScheduleAdmin", "SchedulerProcessAdmin"]
