"""The "Backfill missed runs…" action: a date range, a preview count, then the runs recorded.

An intermediate page, like Django's own "Delete selected": the action renders a form that
posts back to the changelist with the selected schedules, first to preview (how many runs
each schedule would get, how many plan times already have one), then to record them.
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.db import clock
from django_periodic.engine.planning import backfill
from django_periodic.models import Schedule

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEMPLATE = "admin/django_periodic/schedule/backfill.html"
# The buttons of the page: either one binds the form.
PREVIEW, APPLY = "_backfill_preview", "_backfill_apply"


class DateTimeInput(forms.DateTimeInput):
    """The browser's own date and time picker, to the second."""

    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(attrs={"step": 1}, format="%Y-%m-%dT%H:%M:%S")


class BackfillForm(forms.Form):
    start = forms.DateTimeField(
        label=gettext_lazy("From"),
        widget=DateTimeInput(),
        help_text=gettext_lazy("Included."),
    )
    end = forms.DateTimeField(
        label=gettext_lazy("Until"),
        widget=DateTimeInput(),
        help_text=gettext_lazy("Excluded; not after now."),
    )
    rate = forms.FloatField(
        label=gettext_lazy("Released per second"),
        initial=backfill.DEFAULT_RATE,
        min_value=0.001,
        help_text=gettext_lazy("The runs start at most this many per second per schedule."),
    )

    def __init__(self, *args: Any, schedules: list[Schedule], now: datetime, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.schedules = schedules
        self.now = now
        self.previews: list[tuple[Schedule, backfill.BackfillResult]] = []

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        start, end = cleaned.get("start"), cleaned.get("end")
        if start is None or end is None:
            return cleaned
        try:
            start, end = backfill.checked_range(start, end, self.now)
        except backfill.RangeError as exc:
            self.add_error(exc.field, str(exc))
        else:
            self._preview(start, end)
        return cleaned

    def _preview(self, start: datetime, end: datetime) -> None:
        for schedule in self.schedules:
            try:
                self.previews.append((schedule, backfill.preview(schedule, start, end, self.now)))
            except Exception as exc:  # a bad range, the limit, a scope provider's failure
                self.add_error(None, f"{schedule}: {exc}")

    @property
    def to_record(self) -> int:
        return sum(result.recorded for _, result in self.previews)


def backfill_action(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, queryset: QuerySet[Schedule]
) -> TemplateResponse | None:
    """Show the form (and, once valid, the preview); record the runs on "Backfill"."""
    schedules = list(queryset)
    now = clock.now(queryset.db)
    bound = PREVIEW in request.POST or APPLY in request.POST
    form = BackfillForm(request.POST if bound else None, schedules=schedules, now=now)
    if bound and APPLY in request.POST and form.is_valid():
        _record(model_admin, request, form)
        return None  # back to the list, with the report
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Backfill missed runs"),
        "opts": model_admin.model._meta,
        "form": form,
        "schedules": schedules,
        "previews": form.previews if bound and form.is_valid() else None,
        "to_record": form.to_record,
        "limit": backfill.MAX_RUNS,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "preview_button": PREVIEW,
        "apply_button": APPLY,
        "current_timezone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, TEMPLATE, context)


def _record(model_admin: "ModelAdmin[Schedule]", request: HttpRequest, form: BackfillForm) -> None:
    data = form.cleaned_data
    recorded = existing = 0
    for schedule in form.schedules:
        try:
            result = schedule.backfill(data["start"], data["end"], rate=data["rate"], now=form.now)
        except Exception as exc:  # its scope provider failed: the others are still recorded
            message = _("%(name)s not backfilled: %(error)s") % {"name": schedule, "error": exc}
            model_admin.message_user(request, message, messages.ERROR)
            continue
        recorded += result.recorded
        existing += result.existing
    message = ngettext(
        "Recorded %(n)d run to backfill (%(existing)d plan times already had a run); "
        "released at most %(rate)s per second per schedule.",
        "Recorded %(n)d runs to backfill (%(existing)d plan times already had a run); "
        "released at most %(rate)s per second per schedule.",
        recorded,
    )
    params = {"n": recorded, "existing": existing, "rate": f"{data['rate']:g}"}
    model_admin.message_user(request, message % params)
