"""The overview page's view: for users who may view schedules and runs (403 for others),
the sections read once (``sections``) and drawn (``charts``, ``strips``)."""

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.db import router
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from django_periodic.admin.overview import charts, sections, strips
from django_periodic.db import clock
from django_periodic.models import ConcurrencyLimit, Run, Schedule

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEMPLATE = "admin/django_periodic/overview.html"


def overview_view(model_admin: "ModelAdmin[Schedule]", request: HttpRequest) -> Any:
    """The "Overview" page (GET; ``?page=N`` pages through the schedules)."""
    site = model_admin.admin_site
    run_admin = site.get_model_admin(Run)
    if not (model_admin.has_view_permission(request) and run_admin.has_view_permission(request)):
        raise PermissionDenied
    using = router.db_for_read(Schedule)
    now = clock.now(using)
    page, rows = sections.schedule_page(now, request.GET.get("page"), using)
    run_url = reverse(f"{site.name}:django_periodic_run_change", args=[0])
    schedule_url = reverse(f"{site.name}:django_periodic_schedule_change", args=[0])
    hour, day = sections.series(now, "hour", using), sections.series(now, "day", using)
    context = {
        **site.each_context(request),
        "opts": model_admin.opts,
        "title": _("Overview"),
        "now": now,
        "running": sections.running(now, using),
        "failed": sections.failed(now, using),
        "late": sections.late(now, using),
        "attention": sections.needing_attention(using),
        "full_limits": sections.full_limits(now, using),
        "limit_prefix": _limit_prefix(model_admin, request),
        "listed": sections.LISTED,
        # (caption, chart): the caption shown above it, the same words its <title> says.
        "charts": [
            (title, draw(series, chart_id, title))
            for draw, series, chart_id, title in (
                (charts.lag_chart, hour, "lag-hour", _("Start lag, last hour (p50, p99)")),
                (charts.runs_chart, hour, "runs-hour", _("Runs per minute, last hour")),
                (charts.lag_chart, day, "lag-day", _("Start lag, last day (p50, p99)")),
                (charts.runs_chart, day, "runs-day", _("Runs per minute, last day (hourly mean)")),
            )
        ],
        "page": page,
        "rows": [
            (
                row.schedule,
                strips.strip(row.runs, run_url, row.schedule.name),
                strips.timeline(row.timeline, now, row.schedule.name),
            )
            for row in rows
        ],
        "timeline_axis": strips.timeline_axis(now),
        "strip_runs": sections.STRIP_RUNS,
        "schedule_prefix": schedule_url.removesuffix("0/change/"),
        "run_prefix": run_url.removesuffix("0/change/"),
        "current_timezone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, TEMPLATE, context)


def _limit_prefix(model_admin: "ModelAdmin[Schedule]", request: HttpRequest) -> str:
    """Where a limit's page is (its id and "change/" appended), for a user who may see it."""
    site = model_admin.admin_site
    if not site.get_model_admin(ConcurrencyLimit).has_view_permission(request):
        return ""
    return reverse(f"{site.name}:django_periodic_concurrencylimit_changelist")
