"""Runs in the admin: read-only history with its leases inline; retry and cancel."""

from collections import Counter

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic import clock, leases, planner
from django_periodic.admin import display
from django_periodic.models import Lease, Run, Schedule

SCHEDULE_FILTER_LIMIT = 100


class ScheduleFilter(admin.SimpleListFilter):
    """Runs of one schedule. With many schedules only the chosen one is listed (search finds
    the others), so the sidebar never renders thousands of links."""

    title = gettext_lazy("schedule")
    parameter_name = "schedule"

    def lookups(self, request, model_admin):
        schedules = Schedule.objects.order_by("name").values_list("pk", "name")
        listed = list(schedules[: SCHEDULE_FILTER_LIMIT + 1])
        if len(listed) <= SCHEDULE_FILTER_LIMIT:
            return listed
        value = self.value()
        return list(schedules.filter(pk=value)) if value and value.isdigit() else []

    def queryset(self, request, queryset):
        return queryset.filter(schedule_id=self.value()) if self.value() else queryset


def holders(run_ids: list[int], using: str) -> dict[int, str]:
    """The holder of each run's latest lease, in one query."""
    leases = Lease.objects.using(using).filter(run_id__in=run_ids).order_by("run_id", "attempt")
    return dict(leases.values_list("run_id", "holder"))  # the latest attempt is last


class RunChangeList(ChangeList):
    """Loads the holders of the page's runs in one query, after the page is cut."""

    def get_results(self, request):
        super().get_results(request)
        runs = list(self.result_list)
        names = holders([run.pk for run in runs], self.queryset.db)
        for run in runs:
            run.holder_name = names.get(run.pk, "")


class LeaseInline(admin.TabularInline):
    model = Lease
    extra = 0
    can_delete = False
    fields = ["attempt", "holder", "acquired", "heartbeat", "expires", "released", "outcome"]
    readonly_fields = fields
    ordering = ["attempt"]
    acquired = display.timestamp(Lease, "acquired_at")
    heartbeat = display.timestamp(Lease, "heartbeat_at")
    expires = display.timestamp(Lease, "expires_at")
    released = display.timestamp(Lease, "released_at")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        # A run's leases are part of its story: whoever may see the run sees them.
        opts = Run._meta
        return any(
            request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
            for action in ("view", "change")
        )


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Read-only history. The change permission allows the retry and cancel actions only."""

    list_display = [
        "schedule_link",
        "plan",
        "trigger",
        "status_badge",
        "attempts",
        "started",
        "duration_text",
        "lag",
        "holder",
    ]
    list_display_links = ["plan"]
    list_filter = ["status", "trigger", ScheduleFilter]
    list_select_related = ["schedule"]
    search_fields = ["schedule__name", "job_name", "error_code", "error_message"]
    date_hierarchy = "plan_time"
    show_full_result_count = False  # a second COUNT(*) over the whole history on every page
    actions = ["retry", "cancel"]
    inlines = [LeaseInline]
    plan = display.timestamp(Run, "plan_time")
    created = display.timestamp(Run, "created_at")
    started = display.timestamp(Run, "started_at")
    finished = display.timestamp(Run, "finished_at")
    next_retry = display.timestamp(Run, "next_retry_at")
    start_deadline_at = display.timestamp(Run, "start_deadline")
    cancel_requested = display.timestamp(Run, "cancel_requested_at")

    class Media:
        css = {"all": ["django_periodic/admin.css"]}

    def get_changelist(self, request, **kwargs):
        return RunChangeList

    def get_ordering(self, request):
        # Newest plan time first, served by an index (per schedule: its history index).
        return ["-plan_time", "-pk"]

    def get_fieldsets(self, request, obj=None):
        fieldsets = [
            (None, {"fields": ["schedule_link", "status_badge", "trigger", "plan"]}),
        ]
        if obj is not None and (obj.error_code or obj.error_message or obj.traceback):
            fieldsets.append(
                (_("Error"), {"fields": ["error_code", "error_message", "traceback_text"]})
            )
        if obj is not None and obj.result is not None:
            fieldsets.append((_("Result"), {"fields": ["result_json"]}))
        fieldsets += [
            (_("Attempts"), {"fields": ["attempts", "interruptions", "holder", "exclusive"]}),
            (
                _("Times"),
                {
                    "fields": [
                        "created",
                        "started",
                        "finished",
                        "duration_text",
                        "lag",
                        "next_retry",
                        "start_deadline_at",
                        "cancel_requested",
                    ]
                },
            ),
            (_("Job snapshot"), {"fields": ["job_name", "args_json", "kwargs_json"]}),
        ]
        return fieldsets

    def get_readonly_fields(self, request, obj=None):
        return [
            name for _, options in self.get_fieldsets(request, obj) for name in options["fields"]
        ]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history is pruned with `prune_runs`, not by hand

    def has_change_permission(self, request, obj=None):
        # A run is never edited: its page is read-only for everyone. The permission to
        # change runs is what the retry and cancel actions (which ask for it) check.
        return obj is None and super().has_change_permission(request)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/retry/", wrap(self.retry_view), name="{}_{}_retry".format(*info)
            ),
            path(
                "<path:object_id>/cancel/",
                wrap(self.cancel_view),
                name="{}_{}_cancel".format(*info),
            ),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        # Runs are only looked at (and retried or cancelled), never changed.
        return super().changelist_view(request, {"title": _("Runs"), **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        context = {
            "can_act": self.has_change_permission(request),
            "retry_url": self._url("retry", object_id),
            "cancel_url": self._url("cancel", object_id),
            "final_statuses": Run.FINAL_STATUSES,
        }
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def _url(self, name: str, *args, model: str = "run") -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{model}_{name}", args=args)

    # -- columns and read-only fields ---------------------------------------------------------

    @admin.display(description=gettext_lazy("schedule"), ordering="schedule__name")
    def schedule_link(self, run: Run):
        url = self._url("change", run.schedule_id, model="schedule")
        return format_html('<a href="{}">{}</a>', url, run.schedule)

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, run: Run):
        return display.status_badge(run.status, run.error_code)

    @admin.display(description=gettext_lazy("attempt"))
    def attempts(self, run: Run) -> str:
        return f"{run.attempt} / {run.max_attempts}"

    @admin.display(description=gettext_lazy("duration"), ordering="duration")
    def duration_text(self, run: Run) -> str:
        return display.duration(run.duration)

    @admin.display(description=gettext_lazy("lag"))
    def lag(self, run: Run) -> str:
        """How late the run started after its plan time."""
        if run.started_at is None:
            return display.EMPTY
        return display.duration(run.started_at - run.plan_time)

    @admin.display(description=gettext_lazy("holder"))
    def holder(self, run: Run) -> str:
        """The process that holds (or last held) the run's lease."""
        if not hasattr(run, "holder_name"):  # the run's own page
            run.holder_name = holders([run.pk], run._state.db).get(run.pk, "")
        return run.holder_name or display.EMPTY

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_text(self, run: Run):
        return display.preformatted(run.traceback)

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, run: Run):
        return display.pretty_json(run.result)

    @admin.display(description=gettext_lazy("args"))
    def args_json(self, run: Run):
        return display.pretty_json(run.args)

    @admin.display(description=gettext_lazy("kwargs"))
    def kwargs_json(self, run: Run):
        return display.pretty_json(run.kwargs)

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Retry failed runs (a new run)"), permissions=["change"])
    def retry(self, request, queryset):
        failed = list(queryset.filter(status=Run.Status.FAILED).select_related("schedule"))
        if not failed:
            self.message_user(request, _("None of the selected runs failed."), messages.WARNING)
            return
        now = clock.now(queryset.db)
        statuses = Counter(planner.plan_retry(run, now).status for run in failed)
        message = ngettext(
            "Retried %(n)d failed run: %(counts)s.",
            "Retried %(n)d failed runs: %(counts)s.",
            len(failed),
        )
        self.message_user(request, message % {"n": len(failed), "counts": display.counts(statuses)})

    @admin.action(
        description=gettext_lazy("Cancel (waiting runs at once; running ones are asked to stop)"),
        permissions=["change"],
    )
    def cancel(self, request, queryset):
        runs = Run.objects.using(queryset.db).filter(pk__in=queryset.values("pk"))
        cancelled, asked = leases.request_cancel(runs, clock.now(queryset.db))
        self.message_user(
            request,
            _("Cancelled: %(cancelled)d. Asked to stop (running): %(asked)d.")
            % {"cancelled": cancelled, "asked": asked},
            messages.SUCCESS if cancelled or asked else messages.WARNING,
        )

    def retry_view(self, request, object_id):
        """The "Retry" button of a failed run's page (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = self._acted_on(request, object_id)
        if run.status != Run.Status.FAILED:
            self.message_user(request, _("Only a failed run can be retried."), messages.ERROR)
            return HttpResponseRedirect(self._url("change", run.pk))
        new = planner.plan_retry(run, clock.now(run._state.db))
        link = format_html('<a href="{}">{}</a>', self._url("change", new.pk), new)
        self.message_user(request, format_html(_("Retrying as a new run: {}."), link))
        return HttpResponseRedirect(self._url("change", new.pk))

    def cancel_view(self, request, object_id):
        """The "Cancel" button of a waiting or running run's page (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = self._acted_on(request, object_id)
        runs = Run.objects.using(run._state.db).filter(pk=run.pk)
        cancelled, asked = leases.request_cancel(runs, clock.now(run._state.db))
        if cancelled:
            self.message_user(request, _("Cancelled."))
        elif asked:
            self.message_user(request, _("Asked the running job to stop."))
        else:
            self.message_user(
                request,
                _("Nothing to cancel: the run is not waiting or running."),
                messages.WARNING,
            )
        return HttpResponseRedirect(self._url("change", run.pk))

    def _acted_on(self, request, object_id) -> Run:
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404(_("No such run."))
        if not self.has_change_permission(request):
            raise PermissionDenied
        return run
