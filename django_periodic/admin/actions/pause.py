"""The "Pause…" action: until when and why, then the schedules paused, each change logged.

An intermediate page, like the backfill's: the action renders a form that posts back to the
changelist with the selected schedules. "Resume" (an action of its own) ends a pause. A
schedule the model refuses to pause or resume is left as it was, with the reason, and the
others go on.
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.admin.actions.backfill import DateTimeInput
from django_periodic.db import clock
from django_periodic.models import Schedule, pausing
from django_periodic.models.pausing import PAUSE_REASON_MAX_LENGTH, pause_note

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEMPLATE = "admin/django_periodic/schedule/pause.html"
APPLY = "_pause_apply"


class PauseForm(forms.Form):
    until = forms.DateTimeField(
        label=gettext_lazy("Paused until"),
        widget=DateTimeInput(),
        help_text=gettext_lazy("Its fires before then are not run; it goes on from the next."),
    )
    reason = forms.CharField(
        label=gettext_lazy("Why"),
        max_length=PAUSE_REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 2}),
    )

    def __init__(self, *args: Any, now: datetime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.now = now

    def clean_until(self) -> datetime:
        until: datetime = self.cleaned_data["until"]
        if message := pausing.until_error(until, self.now):  # Schedule.pause()'s own rule
            raise forms.ValidationError(message)
        return until


def pause_action(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> TemplateResponse | None:
    """Show the form; pause the schedules when it is posted valid."""
    schedules = list(queryset)
    now = clock.now(queryset.db)
    form = PauseForm(request.POST if APPLY in request.POST else None, now=now)
    if APPLY in request.POST and form.is_valid():
        _pause(model_admin, request, schedules, form.cleaned_data)
        return None  # back to the list, with the report
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Pause schedules"),
        "opts": model_admin.model._meta,
        "form": form,
        "schedules": schedules,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "apply_button": APPLY,
        "current_timezone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, TEMPLATE, context)


def _pause(
    model_admin: "ModelAdmin[Schedule]",
    request: HttpRequest,
    schedules: list[Schedule],
    data: dict[str, Any],
) -> None:
    by = request.user.get_username()
    paused = []
    for schedule in schedules:
        try:
            schedule.pause(data["until"], data["reason"], by=by)
        except ValidationError as exc:
            _refused(model_admin, request, schedule, exc)
            continue
        paused.append(schedule)
        note = pause_note(data["until"], data["reason"], by)
        model_admin.log_change(request, schedule, note)  # the schedule's history
    message = ngettext("Paused %(n)d schedule.", "Paused %(n)d schedules.", len(paused))
    model_admin.message_user(request, message % {"n": len(paused)})


def _refused(
    model_admin: "ModelAdmin[Schedule]",
    request: HttpRequest,
    schedule: Schedule,
    error: ValidationError,
) -> None:
    """Say why one schedule was left as it was; the others go on."""
    reasons = " ".join(error.messages)
    message = _("%(name)s was left as it was: %(reasons)s")
    model_admin.message_user(
        request, message % {"name": schedule.name, "reasons": reasons}, level=messages.ERROR
    )


def resume_action(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> None:
    """End the pauses of the selected schedules that are paused; each goes on from now."""
    now = clock.now(queryset.db)
    note = _("Resumed: its pause ended early.")  # the log's, and its version's reason
    resumed = []
    for schedule in (schedule for schedule in queryset if schedule.is_paused(now)):
        try:
            schedule.resume(by=request.user.get_username(), reason=note)
        except ValidationError as exc:
            _refused(model_admin, request, schedule, exc)
            continue
        resumed.append(schedule)
        model_admin.log_change(request, schedule, note)
    message = ngettext(
        "Resumed %(n)d paused schedule.", "Resumed %(n)d paused schedules.", len(resumed)
    )
    model_admin.message_user(request, message % {"n": len(resumed)})
