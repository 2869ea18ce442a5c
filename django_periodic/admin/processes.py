"""Who holds what: leases and the scheduler processes that heartbeat them."""

from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.db.models import Count, DurationField, ExpressionWrapper, F, Model, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.admin import display
from django_periodic.admin.secrets import SecretsUnfiltered
from django_periodic.models import Lease, SchedulerProcess
from django_periodic.models.processes import held_through

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    # django-stubs makes ModelAdmin generic; at run time it takes no type arguments.
    _LeaseAdmin = admin.ModelAdmin[Lease]
    _SchedulerProcessAdmin = admin.ModelAdmin[SchedulerProcess]
else:
    _LeaseAdmin = _SchedulerProcessAdmin = admin.ModelAdmin


class ProcessStats(TypedDict):
    """What SchedulerProcessAdmin.get_queryset() annotates each process with."""

    held: int
    silence: timedelta


class ReadOnlyAdmin:
    """What the schedulers write; people only look. A mixin, before ModelAdmin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin, SecretsUnfiltered, _LeaseAdmin):
    list_display = ["run", "attempt", "holder", "acquired", "heartbeat", "released", "outcome"]
    list_filter = ["outcome", "process"]
    list_select_related = ["run"]
    search_fields = ["holder"]
    show_full_result_count = False
    acquired = display.timestamp(Lease, "acquired_at")
    heartbeat = display.timestamp(Lease, "heartbeat_at")
    released = display.timestamp(Lease, "released_at")


@admin.register(SchedulerProcess)
class SchedulerProcessAdmin(ReadOnlyAdmin, SecretsUnfiltered, _SchedulerProcessAdmin):
    """The "Schedulers" page: who is alive, since when, holding how many runs."""

    list_display = [
        "__str__", "state", "started", "last_heartbeat", "runs_held", "job_count", "ledger_format"
    ]  # fmt: skip
    started = display.timestamp(SchedulerProcess, "started_at")

    class Media:
        css = {"all": ["django_periodic/admin.css"]}

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(request, {"title": _("Schedulers"), **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> QuerySet[SchedulerProcess]:
        held = Count("leases", filter=held_through("leases"))
        # The database's clock, the one heartbeats are written with.
        silence = ExpressionWrapper(Now() - F("heartbeat_at"), output_field=DurationField())
        return super().get_queryset(request).annotate(held=held, silence=silence)

    @admin.display(description=gettext_lazy("state"))
    def state(self, process: "WithAnnotations[SchedulerProcess, ProcessStats]") -> SafeString:
        if SchedulerProcess.stale_silence(process.silence):
            n = SchedulerProcess.STALE_AFTER_HEARTBEATS
            title = _("No heartbeat for %(n)d intervals.") % {"n": n}
            return display.badge("failed", _("stale"), title)
        return display.badge("succeeded", _("alive"))

    @admin.display(description=gettext_lazy("last heartbeat"), ordering="heartbeat_at")
    def last_heartbeat(
        self, process: "WithAnnotations[SchedulerProcess, ProcessStats]"
    ) -> SafeString:
        ago = _("%(duration)s ago") % {"duration": display.duration(process.silence)}
        return format_html(
            '{}<br><span class="periodic-quiet">{}</span>',
            ago,
            display.absolute(process.heartbeat_at),
        )

    @admin.display(description=gettext_lazy("runs held"), ordering="held")
    def runs_held(self, process: "WithAnnotations[SchedulerProcess, ProcessStats]") -> SafeString:
        url = reverse(f"{self.admin_site.name}:django_periodic_lease_changelist")
        query = f"?process__id__exact={process.pk}&released_at__isnull=True"
        return format_html('<a href="{}{}">{}</a>', url, query, process.held)

    @admin.display(description=gettext_lazy("jobs"))
    def job_count(self, process: SchedulerProcess) -> SafeString:
        """How many jobs its code registers, named in the tooltip (a rolling deploy shows
        which processes have a new job)."""
        if process.jobs is None:
            return format_html('<span class="periodic-quiet">{}</span>', _("not stated"))
        names = "\n".join(sorted(process.jobs))
        return format_html('<span title="{}">{}</span>', names, len(process.jobs))
