"""Concurrency limits in the admin: each with how many runs hold its slots and how many wait
for one (counted in the list's one query), and on its page the holders, the oldest waiting
runs and the schedules that name it, as links to those who may view runs and schedules, else
only how many. Each save is a version, listed on its history page (``Versioned``)."""

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.admin import display
from django_periodic.admin.changes.versions import Versioned, reason_field
from django_periodic.admin.secrets import SecretsUnfiltered
from django_periodic.models import ConcurrencyLimit, Run, Schedule, limits

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldGroups

    _ConcurrencyLimitAdmin = admin.ModelAdmin[ConcurrencyLimit]
    _ConcurrencyLimitModelForm = forms.ModelForm[ConcurrencyLimit]
else:
    _ConcurrencyLimitAdmin = admin.ModelAdmin
    _ConcurrencyLimitModelForm = forms.ModelForm

# The runs a limit's page lists of its holders, and of its waiting runs (the oldest).
LISTED = 20
# Its own fields, edited on its page (those its versions record).
EDITED_FIELDS = limits.VERSIONED_FIELDS


def run_count(condition: Q, of: OuterRef | None = None, **fields: Any) -> Coalesce:
    """How many runs of the limit in the outer query (``of``) meet ``condition`` (and have
    these ``fields``), as a subquery: each counts through the partial index of its
    condition (``periodic_run_held``, ``periodic_run_limited``), never through the limit's
    whole history."""
    runs = (
        Run.objects.filter(condition, concurrency_limit=of or OuterRef("pk"), **fields)
        .order_by()
        .values("concurrency_limit")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return Coalesce(Subquery(runs, output_field=IntegerField()), 0)


def _run_text(run: Run) -> str:
    """A run as a limit's page lists it: its schedule, its scope key if any, its plan time."""
    parts = [run.schedule.name, run.scope, display.absolute(run.plan_time)]
    return " · ".join(part for part in parts if part)


class ConcurrencyLimitForm(_ConcurrencyLimitModelForm):
    # Not a field of the limit: why this change, which its version records.
    version_reason = reason_field()

    class Meta:
        model = ConcurrencyLimit
        fields = EDITED_FIELDS


@admin.register(ConcurrencyLimit)
class ConcurrencyLimitAdmin(SecretsUnfiltered, Versioned, _ConcurrencyLimitAdmin):
    form = ConcurrencyLimitForm
    list_display = ["name", "max_running", "per_scope", "holding", "waiting"]
    search_fields = ["name"]

    class Media:
        css = {"all": ["django_periodic/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[ConcurrencyLimit]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                holding_count=run_count(limits.HOLDING), waiting_count=run_count(limits.WAITING)
            )
        )

    def get_fields(
        self, request: HttpRequest, obj: ConcurrencyLimit | None = None
    ) -> "_FieldGroups":
        # Why, for one who adds or may change it; a new limit has no runs nor schedules yet.
        editing = obj is None or self.has_change_permission(request, obj)
        reason = ("version_reason",) if editing else ()
        state = () if obj is None else self._state_fields(request)
        return (*EDITED_FIELDS, *reason, *state)

    def get_readonly_fields(
        self, request: HttpRequest, obj: ConcurrencyLimit | None = None
    ) -> list[str] | tuple[str, ...]:
        return self._state_fields(request)

    def _state_fields(self, request: HttpRequest) -> tuple[str, ...]:
        """Its runs and schedules, by name and link to a user who may view them; else only
        how many (a schedule's name is the schedules' to show, as on a calendar's page)."""
        runs = (
            ("holders", "waiting_runs") if self._may_view(request, Run) else ("holding", "waiting")
        )
        schedules = "used_by" if self._may_view(request, Schedule) else "schedule_total"
        return (*runs, schedules)

    def _may_view(self, request: HttpRequest, model: type[Run] | type[Schedule]) -> bool:
        model_admin = self.admin_site._registry.get(model)
        return model_admin is not None and model_admin.has_view_permission(request)

    @admin.display(description=gettext_lazy("holding"), ordering="holding_count")
    def holding(self, limit: ConcurrencyLimit) -> int:
        """Runs holding a slot: admitted, and not ended."""
        return int(getattr(limit, "holding_count", 0))

    @admin.display(description=gettext_lazy("waiting"), ordering="waiting_count")
    def waiting(self, limit: ConcurrencyLimit) -> int:
        """Runs waiting for a slot."""
        return int(getattr(limit, "waiting_count", 0))

    @admin.display(description=gettext_lazy("holding a slot"))
    def holders(self, limit: ConcurrencyLimit) -> SafeString | str:
        runs = limit.runs.filter(limits.HOLDING).order_by("plan_time", "pk")
        return self._run_list(runs, self.holding(limit))

    @admin.display(description=gettext_lazy("waiting, oldest first"))
    def waiting_runs(self, limit: ConcurrencyLimit) -> SafeString | str:
        # The order admission admits them in (within a scope key, for a per-scope limit).
        runs = limit.runs.filter(limits.WAITING).order_by("plan_time", "pk")
        return self._run_list(runs, self.waiting(limit))

    @admin.display(description=gettext_lazy("used by"))
    def used_by(self, limit: ConcurrencyLimit) -> SafeString | str:
        schedules = limit.schedules.order_by("name").values_list("pk", "name")
        links = format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            ((self._url(Schedule, pk), name) for pk, name in schedules),
        )
        return links or display.EMPTY

    @admin.display(description=gettext_lazy("used by"))
    def schedule_total(self, limit: ConcurrencyLimit) -> str:
        count = limit.schedules.count()
        return ngettext("%(n)d schedule", "%(n)d schedules", count) % {"n": count}

    def _run_list(self, runs: QuerySet[Run], total: int) -> SafeString | str:
        """The first ``LISTED`` of ``runs``, each a link to its page, and how many more."""
        shown = list(runs.select_related("schedule")[:LISTED])
        if not shown:
            return display.EMPTY
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a></li>',
            ((self._url(Run, run.pk), _run_text(run)) for run in shown),
        )
        more = ""
        if total > len(shown):
            more = _("and %(n)d more") % {"n": total - len(shown)}
        return format_html('<ul class="periodic-limit-runs">{}</ul>{}', items, more)

    def _url(self, model: type[Run] | type[Schedule], pk: int) -> str:
        name = f"{self.admin_site.name}:{model._meta.app_label}_{model._meta.model_name}_change"
        return reverse(name, args=[pk])
