"""The schedule list's sidebar filters: by trigger kind, by the last run's status, by
whether it needs attention (its alerts), and by where the schedule is defined (code or
database)."""

from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.admin import history
from django_periodic.admin.forms import KIND_LABELS
from django_periodic.models import Run, Schedule, ScheduleQuerySet

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


class TriggerKindFilter(admin.SimpleListFilter):
    title = gettext_lazy("trigger kind")
    parameter_name = "kind"

    def lookups(
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> "list[tuple[str, StrOrPromise]]":
        return list(KIND_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in Schedule.Kind.values:
            # The admin's queryset comes from Schedule.objects.
            return cast(ScheduleQuerySet, queryset).of_kind(value)
        return queryset


class LastStatusFilter(admin.SimpleListFilter):
    title = gettext_lazy("last run")
    parameter_name = "last_status"

    def lookups(
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> "list[tuple[str, StrOrPromise]]":
        return [*Run.Status.choices, ("none", _("never ran"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        value = self.value()
        if not value:
            return queryset
        queryset = queryset.annotate(last_status=history.last_status())
        if value == "none":
            return queryset.filter(last_status__isnull=True)
        return queryset.filter(last_status=value)


class CodeDefinedFilter(admin.SimpleListFilter):
    title = gettext_lazy("defined in")
    parameter_name = "defined"

    def lookups(
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> "list[tuple[str, StrOrPromise]]":
        return [("code", _("code (@job)")), ("admin", _("the database (admin, ORM)"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        if self.value() == "code":
            return queryset.exclude(defined_in="")
        if self.value() == "admin":
            return queryset.filter(defined_in="")
        return queryset


class AttentionFilter(admin.SimpleListFilter):
    """Schedules needing attention by their alerts, as the scheduler last judged."""

    title = gettext_lazy("attention")
    parameter_name = "attention"

    def lookups(
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> "list[tuple[str, StrOrPromise]]":
        return [("yes", _("needs attention")), ("no", _("fine"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # The admin's queryset comes from Schedule.objects.
        if self.value() == "yes":
            return cast(ScheduleQuerySet, queryset).needing_attention()
        if self.value() == "no":
            return queryset.filter(attention_reason="")
        return queryset
