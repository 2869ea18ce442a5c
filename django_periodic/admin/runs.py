"""Runs in the admin: read-only history with its leases inline; retry and cancel."""

from collections import Counter
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.db.models.expressions import Combinable
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_periodic.admin import display
from django_periodic.admin.actions import refusal
from django_periodic.admin.changes import versions
from django_periodic.admin.run_list import (
    RunChangeList,
    RunHolder,
    ScheduleFilter,
    ScopeFilter,
    holders,
)
from django_periodic.admin.secrets import SecretsUnfiltered
from django_periodic.choices import WAITING_STATUSES
from django_periodic.db import clock
from django_periodic.engine.runs import leases, retries
from django_periodic.models import Lease, Run, limits

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldOpts, _FieldsetSpec
    from django_stubs_ext import StrOrPromise, WithAnnotations

    # django-stubs makes these generic; at run time they take no type arguments.
    _LeaseInline = admin.TabularInline[Lease, Run]
    _RunAdmin = admin.ModelAdmin[Run]
else:
    _LeaseInline = admin.TabularInline
    _RunAdmin = admin.ModelAdmin

# A run's leases, as its page lists them (read-only).
LEASE_FIELDS = ("attempt", "holder", "acquired", "heartbeat", "expires", "released", "outcome")


class LeaseInline(_LeaseInline):
    model = Lease
    extra = 0
    can_delete = False
    fields = readonly_fields = LEASE_FIELDS
    ordering = ["attempt"]
    acquired = display.timestamp(Lease, "acquired_at")
    heartbeat = display.timestamp(Lease, "heartbeat_at")
    expires = display.timestamp(Lease, "expires_at")
    released = display.timestamp(Lease, "released_at")

    def has_add_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        # A run's leases are part of its story: whoever may see the run sees them.
        opts = Run._meta
        return any(
            request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
            for action in ("view", "change")
        )


@admin.register(Run)
class RunAdmin(SecretsUnfiltered, _RunAdmin):
    """Read-only history. The change permission allows the retry and cancel actions only."""

    list_display = [
        "schedule_link",
        "scope_text",
        "plan",
        "release",
        "trigger",
        "revision_link",
        "status_badge",
        "attempts",
        "started",
        "duration_text",
        "lag",
        "holder",
    ]
    list_display_links = ["plan"]
    list_filter = ["status", "trigger", ScheduleFilter, ScopeFilter]
    list_select_related = ["schedule", "concurrency_limit"]
    search_fields = ["schedule__name", "=scope", "job_name", "error_code", "error_message"]
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
    finish_by_at = display.timestamp(Run, "finish_by")
    late = display.timestamp(Run, "late_at")
    cancel_requested = display.timestamp(Run, "cancel_requested_at")

    class Media:
        css = {"all": ["django_periodic/admin.css"]}

    @admin.display(description=gettext_lazy("revision"), ordering="schedule_revision")
    def revision_link(self, run: Run) -> SafeString | str:
        """Its schedule's revision, linked to that revision's versions."""
        return versions.revision_link(run)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        # Newest plan time first, served by an index (per schedule: its history index).
        return ["-plan_time", "-pk"]

    def get_fieldsets(self, request: HttpRequest, obj: Run | None = None) -> "_FieldsetSpec":
        fieldsets: list[tuple[StrOrPromise | None, _FieldOpts]] = [
            (
                None,
                {
                    "fields": [
                        "schedule_link",
                        "scope_text",
                        "status_badge",
                        "trigger",
                        "revision_link",
                        "plan",
                        "release",
                        "limit_link",
                    ]
                },
            ),
        ]
        if obj is not None and (obj.error_code or obj.error_message or obj.traceback):
            fieldsets.append(
                (_("Error"), {"fields": ["error_code", "error_message", "traceback_text"]})
            )
        if obj is not None and obj.result is not None:
            fieldsets.append((_("Result"), {"fields": ["result_json"]}))
        fieldsets += [
            (_("Attempts"), {"fields": ["attempts", "interruptions", "holder", "exclusive"]}),
        ]
        if obj is not None and obj.tasks_backend:
            fieldsets.append(
                (
                    _("Handed to a tasks backend"),
                    {"fields": ["tasks_backend", "task_id", "enqueued_at"]},
                )
            )
        fieldsets += [
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
                        "finish_by_at",
                        "late",
                        "cancel_requested",
                    ]
                },
            ),
            (_("Job snapshot"), {"fields": ["job_name", "args_json", "kwargs_json"]}),
        ]
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Run | None = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False  # history is pruned with `prune_runs`, not by hand

    def has_change_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        # A run is never edited: its page is read-only for everyone. The permission to
        # change runs is what the retry and cancel actions (which ask for it) check.
        return obj is None and super().has_change_permission(request)

    def get_urls(self) -> list[URLPattern]:
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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Runs are only looked at (and retried or cancelled), never changed.
        return super().changelist_view(request, {"title": _("Runs"), **(extra_context or {})})

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {
            "can_act": self.has_change_permission(request),
            "retry_url": self._url("retry", object_id),
            "cancel_url": self._url("cancel", object_id),
            "final_statuses": Run.FINAL_STATUSES,
        }
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def _url(self, name: str, *args: object, model: str = "run") -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{model}_{name}", args=args)

    # -- columns and read-only fields ---------------------------------------------------------

    @admin.display(description=gettext_lazy("schedule"), ordering="schedule__name")
    def schedule_link(self, run: Run) -> SafeString:
        url = self._url("change", run.schedule_id, model="schedule")
        return format_html('<a href="{}">{}</a>', url, run.schedule)

    @admin.display(description=gettext_lazy("scope"), ordering="scope")
    def scope_text(self, run: Run) -> str:
        return run.scope or display.EMPTY

    @admin.display(description=gettext_lazy("release time"), ordering="release_at")
    def release(self, run: Run) -> str:
        """When it may first start; for a run held by its concurrency limit, what it waits
        for (its release time is then a stand-in past every real one, not a time)."""
        if run.release_at != limits.HELD:
            return display.absolute(run.release_at)
        if run.status not in WAITING_STATUSES:
            return display.EMPTY  # it ended before its limit admitted it
        if run.concurrency_limit is None:  # its limit deleted: admitted at the next pass
            return _("waiting for admission")
        return _("waiting for “%(limit)s”") % {"limit": run.concurrency_limit.name}

    @admin.display(description=gettext_lazy("concurrency limit"))
    def limit_link(self, run: Run) -> SafeString | str:
        if run.concurrency_limit_id is None:
            return display.EMPTY
        url = self._url("change", run.concurrency_limit_id, model="concurrencylimit")
        return format_html('<a href="{}">{}</a>', url, run.concurrency_limit)

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, run: Run) -> SafeString:
        if run.awaits_release:
            released = display.absolute(run.next_retry_at)
            title = _("Backfilled: starts at %(time)s") % {"time": released}
            return display.badge(run.status, _("awaiting release"), title)
        return display.status_badge(run.status, run.error_code)

    @admin.display(description=gettext_lazy("attempt"))
    def attempts(self, run: Run) -> str:
        return f"{run.attempt} / {run.max_attempts}"

    @admin.display(description=gettext_lazy("duration"), ordering="duration")
    def duration_text(self, run: Run) -> str:
        return display.duration(run.duration)

    @admin.display(description=gettext_lazy("lag"))
    def lag(self, run: Run) -> str:
        """How late the run started after its release (its plan time, or later by a
        stagger)."""
        if run.started_at is None:
            return display.EMPTY
        return display.duration(run.started_at - run.release_time)

    @admin.display(description=gettext_lazy("holder"))
    def holder(self, run: "WithAnnotations[Run, RunHolder]") -> str:
        """The process that holds (or last held) the run's lease."""
        if not hasattr(run, "holder_name"):  # the run's own page
            using = run._state.db or "default"
            run.holder_name = holders([run.pk], using).get(run.pk, "")
        return run.holder_name or display.EMPTY

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_text(self, run: Run) -> SafeString:
        return display.preformatted(run.traceback)

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, run: Run) -> SafeString:
        return display.pretty_json(run.result)

    @admin.display(description=gettext_lazy("args"))
    def args_json(self, run: Run) -> SafeString:
        return display.pretty_json(run.args)

    @admin.display(description=gettext_lazy("kwargs"))
    def kwargs_json(self, run: Run) -> SafeString:
        return display.pretty_json(run.kwargs)

    # -- actions ------------------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Retry failed runs (a new run)"), permissions=["change"])
    def retry(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        failed = list(queryset.filter(status=Run.Status.FAILED).select_related("schedule"))
        if not failed:
            self.message_user(request, _("None of the selected runs failed."), messages.WARNING)
            return
        now = clock.now(queryset.db)
        statuses: Counter[str] = Counter()
        for run in failed:
            try:
                statuses[retries.plan_retry(run, now).status] += 1
            except ValidationError as exc:  # its schedule's value out of range: the others go
                message = _("%(run)s not retried: %(error)s")
                self.message_user(
                    request, message % {"run": run, "error": refusal(exc)}, messages.ERROR
                )
        if not statuses:
            return
        n = statuses.total()
        message = ngettext(
            "Retried %(n)d failed run: %(counts)s.",
            "Retried %(n)d failed runs: %(counts)s.",
            n,
        )
        self.message_user(request, message % {"n": n, "counts": display.counts(statuses)})

    @admin.action(
        description=gettext_lazy("Cancel (waiting runs at once; running ones are asked to stop)"),
        permissions=["change"],
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        runs = Run.objects.using(queryset.db).filter(pk__in=queryset.values("pk"))
        cancelled, asked = leases.request_cancel(runs, clock.now(queryset.db))
        self.message_user(
            request,
            _("Cancelled: %(cancelled)d. Asked to stop (running): %(asked)d.")
            % {"cancelled": cancelled, "asked": asked},
            messages.SUCCESS if cancelled or asked else messages.WARNING,
        )

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """The "Retry" button of a failed run's page (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = self._acted_on(request, object_id)
        if run.status != Run.Status.FAILED:
            self.message_user(request, _("Only a failed run can be retried."), messages.ERROR)
            return HttpResponseRedirect(self._url("change", run.pk))
        try:
            new = retries.plan_retry(run, clock.now(run._state.db or "default"))
        except ValidationError as exc:  # its schedule's value out of range
            self.message_user(
                request, _("Not retried: %(error)s") % {"error": refusal(exc)}, messages.ERROR
            )
            return HttpResponseRedirect(self._url("change", run.pk))
        link = format_html('<a href="{}">{}</a>', self._url("change", new.pk), new)
        self.message_user(request, format_html(_("Retrying as a new run: {}."), link))
        return HttpResponseRedirect(self._url("change", new.pk))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """The "Cancel" button of a waiting or running run's page (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = self._acted_on(request, object_id)
        using = run._state.db or "default"
        runs = Run.objects.using(using).filter(pk=run.pk)
        cancelled, asked = leases.request_cancel(runs, clock.now(using))
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

    def _acted_on(self, request: HttpRequest, object_id: str) -> Run:
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404(_("No such run."))
        if not self.has_change_permission(request):
            raise PermissionDenied
        return run
