"""The run list: its sidebar filters (by schedule, by scope) and the holders of a page's
runs, loaded in one query after the page is cut."""

from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.models import Lease, Schedule

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

SCHEDULE_FILTER_LIMIT = 100


class RunHolder(TypedDict):
    """What RunChangeList (or RunAdmin.holder, on a run's own page) sets on each run."""

    holder_name: str


class ScheduleFilter(admin.SimpleListFilter):
    """Runs of one schedule. With many schedules only the chosen one is listed (search finds
    the others), so the sidebar never renders thousands of links."""

    title = gettext_lazy("schedule")
    parameter_name = "schedule"

    # The stubs want str values; Django str()s them (here: primary keys) for the query string.
    def lookups(  # type: ignore[override]
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> list[tuple[int, str]]:
        schedules = Schedule.objects.order_by("name").values_list("pk", "name")
        listed = list(schedules[: SCHEDULE_FILTER_LIMIT + 1])
        if len(listed) <= SCHEDULE_FILTER_LIMIT:
            return listed
        value = self.value()
        return list(schedules.filter(pk=value)) if value and value.isdigit() else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(schedule_id=self.value()) if self.value() else queryset


class ScopeFilter(admin.SimpleListFilter):
    """Runs of one scope key (``?scope=acme``; the schedule page links each scope's runs), or
    the unscoped ones. A fanned-out history has thousands of keys, so none is listed but the
    chosen one; the search box finds a key too."""

    title = gettext_lazy("scope")
    parameter_name = "scope"
    UNSCOPED = "-"

    def lookups(
        self, request: HttpRequest, model_admin: "admin.ModelAdmin[Any]"
    ) -> "list[tuple[str, StrOrPromise]]":
        choices: list[tuple[str, StrOrPromise]] = [(self.UNSCOPED, _("none (not fanned out)"))]
        value = self.value()
        if value and value != self.UNSCOPED:
            choices.append((value, value))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(scope="" if value == self.UNSCOPED else value)


def holders(run_ids: list[int], using: str) -> dict[int, str]:
    """The holder of each run's latest lease, in one query."""
    leases = Lease.objects.using(using).filter(run_id__in=run_ids).order_by("run_id", "attempt")
    return dict(leases.values_list("run_id", "holder"))  # the latest attempt is last


class RunChangeList(ChangeList):
    """Loads the holders of the page's runs in one query, after the page is cut."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        runs = list(self.result_list)
        names = holders([run.pk for run in runs], self.queryset.db)
        for run in runs:
            run.holder_name = names.get(run.pk, "")
