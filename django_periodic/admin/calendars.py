"""Calendars in the admin: closed weekdays as checkboxes, closed dates one per line, public
holidays by country, blackout periods as JSON; the schedules that use each, by name to those
who may view schedules, else only how many."""

from datetime import date
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_periodic.admin.secrets import SecretsUnfiltered
from django_periodic.models import Calendar, Schedule
from django_periodic.timing import business_days

if TYPE_CHECKING:
    _CalendarAdmin = admin.ModelAdmin[Calendar]
    _CalendarModelForm = forms.ModelForm[Calendar]
else:
    _CalendarAdmin = admin.ModelAdmin
    _CalendarModelForm = forms.ModelForm


class DatesField(forms.Field):
    """Dates one per line (``2026-12-24``), stored as a JSON list of ISO dates."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 20, "placeholder": "2026-12-24"})

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return value
        lines = [line.strip() for line in str(value or "").splitlines()]
        days = []
        for line in filter(None, lines):
            try:
                days.append(date.fromisoformat(line).isoformat())
            except ValueError:
                raise forms.ValidationError(
                    _("%(value)s is not a date such as 2026-12-24."), params={"value": line}
                ) from None
        return sorted(set(days))


class CalendarForm(_CalendarModelForm):
    closed_weekdays = forms.TypedMultipleChoiceField(
        choices=list(enumerate(business_days.WEEKDAYS)),
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label=_("closed weekdays"),
    )
    closed_dates = DatesField(required=False, label=_("closed dates"))

    class Meta:
        model = Calendar
        fields = [
            "name",
            "timezone",
            "closed_weekdays",
            "closed_dates",
            "holidays_country",
            "holidays_subdivision",
            "blackouts",
        ]
        widgets = {"blackouts": forms.Textarea(attrs={"rows": 3, "class": "vLargeTextField"})}


@admin.register(Calendar)
class CalendarAdmin(SecretsUnfiltered, _CalendarAdmin):
    form = CalendarForm
    list_display = ["name", "timezone", "closed_days", "holidays_country", "schedule_count"]
    search_fields = ["name"]

    def get_readonly_fields(
        self, request: HttpRequest, obj: Calendar | None = None
    ) -> list[str] | tuple[str, ...]:
        # A schedule's name is the schedules' to show: without leave to view them, a count.
        may_view = self._may_view_schedules(request)
        return ["schedule_list" if may_view else "schedule_total"]

    def _may_view_schedules(self, request: HttpRequest) -> bool:
        schedule_admin = self.admin_site._registry.get(Schedule)
        if schedule_admin is not None:
            return schedule_admin.has_view_permission(request)
        options = Schedule._meta
        names = [get_permission_codename(a, options) for a in ("view", "change")]
        return any(request.user.has_perm(f"{options.app_label}.{n}") for n in names)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Calendar]:
        return super().get_queryset(request).annotate(schedule_count=Count("schedules"))

    @admin.display(description=_("closed weekdays"))
    def closed_days(self, calendar: Calendar) -> str:
        days = calendar.closed_weekdays if isinstance(calendar.closed_weekdays, list) else []
        names = [business_days.WEEKDAYS[d][:3] for d in sorted(days) if d in range(7)]
        return ", ".join(names) or "—"

    @admin.display(description=_("schedules"), ordering="schedule_count")
    def schedule_count(self, calendar: Calendar) -> int:
        return int(getattr(calendar, "schedule_count", 0))

    @admin.display(description=_("used by"))
    def schedule_list(self, calendar: Calendar) -> str:
        if calendar.pk is None:
            return "—"
        names = calendar.schedules.values_list("name", flat=True)
        return ", ".join(names) or "—"

    @admin.display(description=_("used by"))
    def schedule_total(self, calendar: Calendar) -> str:
        count = calendar.schedules.count() if calendar.pk is not None else 0
        return ngettext("%(n)d schedule", "%(n)d schedules", count) % {"n": count}
