"""The schedule list's actions: run now, enable, resume with catch-up, disable, pause,
resume, backfill.

Each action is a method of ScheduleAdmin, defined here and set on the class under its name
(where the admin looks actions up), so ``model_admin`` is the ScheduleAdmin acting.
"""

from collections import Counter
from typing import TYPE_CHECKING, cast

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.admin import display
from django_periodic.admin.actions import backfill as backfill_page
from django_periodic.admin.actions import pause as pause_page
from django_periodic.db import announcements, clock
from django_periodic.models import Schedule, ScheduleQuerySet, changed_by
from django_periodic.timing import triggers

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


@admin.action(
    description=gettext_lazy("Run now (through the overlap policy)"), permissions=["change"]
)
def run_now(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    statuses: Counter[str] = Counter()
    for schedule in queryset:
        try:
            statuses.update(run.status for run in schedule.run_now_for_all_scopes())
        except ValidationError as exc:  # a value stored out of its range: the others still run
            message = _("%(name)s not run: %(error)s")
            model_admin.message_user(
                request, message % {"name": schedule, "error": refusal(exc)}, messages.ERROR
            )
        except Exception as exc:  # a scope provider's code failed: the others still run
            message = _("%(name)s not run: its scope provider failed: %(error)s")
            model_admin.message_user(
                request, message % {"name": schedule, "error": exc}, messages.ERROR
            )
    if statuses:  # else each schedule's refusal said it all
        report_requested(model_admin, request, statuses)


def refusal(error: ValidationError) -> str:
    """A run refused for a value of its schedule (``run_now()``, a retry), in one line."""
    return " ".join(error.messages)


def report_requested(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, statuses: "Counter[str]"
) -> None:
    """Say how many runs were requested, by status (the action's and the "Run now" button's
    message)."""
    n = statuses.total()
    message = ngettext("Requested %(n)d run: %(counts)s.", "Requested %(n)d runs: %(counts)s.", n)
    model_admin.message_user(request, message % {"n": n, "counts": display.counts(statuses)})


@admin.action(
    description=gettext_lazy("Enable: resume from now, without catch-up"),
    permissions=["change"],
)
def enable(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    resumed, failed = _restart(queryset.filter(enabled=False), request.user.get_username())
    _report_resumed(model_admin, request, resumed, failed)


@admin.action(
    description=gettext_lazy("Resume with catch-up (the misfire policy decides)"),
    permissions=["change"],
)
def resume_with_catch_up(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    paused = queryset.filter(enabled=False)
    # Without a cursor there is nothing to catch up: such a schedule restarts from now.
    by = request.user.get_username()
    resumed, failed = _restart(paused.filter(next_fire_at__isnull=True), by)
    # update() bypasses save(), which would restart the cursor from now: the stored
    # cursor stays, and the planner fires or skips the missed times by the misfire policy.
    kept = cast(ScheduleQuerySet, paused.filter(next_fire_at__isnull=False))
    resumed += kept.update_versioned(by=by, enabled=True, updated_at=clock.now(queryset.db))
    announcements.notify(queryset.db)
    _report_resumed(model_admin, request, resumed, failed)


@admin.action(description=gettext_lazy("Disable (pause)"), permissions=["change"])
def disable(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    enabled = cast(ScheduleQuerySet, queryset.filter(enabled=True))
    by = request.user.get_username()
    paused = enabled.update_versioned(by=by, enabled=False, updated_at=clock.now(queryset.db))
    message = ngettext("Paused %(n)d schedule.", "Paused %(n)d schedules.", paused)
    model_admin.message_user(request, message % {"n": paused})


@admin.action(description=gettext_lazy("Pause… (until when, and why)"), permissions=["change"])
def pause(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponseBase | None:
    return pause_page.pause_action(model_admin, request, queryset)


@admin.action(description=gettext_lazy("Resume: end the pause now"), permissions=["change"])
def resume(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    pause_page.resume_action(model_admin, request, queryset)


@admin.action(description=gettext_lazy("Backfill missed runs…"), permissions=["change"])
def backfill(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> HttpResponseBase | None:
    return backfill_page.backfill_action(model_admin, request, queryset)


def _restart(queryset: QuerySet[Schedule], by: str) -> tuple[int, list[str]]:
    """Enable each schedule through save(), which restarts its cursor from now (a version
    by ``by``)."""
    resumed, failed = 0, []
    for schedule in queryset:
        schedule.enabled = True
        try:
            with changed_by(by):
                schedule.save(update_fields=["enabled", "updated_at"])
        except triggers.InvalidTrigger as exc:
            failed.append(f"{schedule.name}: {exc}")
        else:
            resumed += 1
    return resumed, failed


def _report_resumed(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, resumed: int, failed: list[str]
) -> None:
    message = ngettext("Resumed %(n)d schedule.", "Resumed %(n)d schedules.", resumed)
    model_admin.message_user(request, message % {"n": resumed})
    if failed:
        message = _("Not resumed, the trigger is invalid: %(names)s") % {"names": "; ".join(failed)}
        model_admin.message_user(request, message, messages.ERROR)
