"""The schedules in the admin: a trigger editor with a live preview, a list with run history."""

from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext as _

from django_periodic.admin import actions as schedule_actions
from django_periodic.admin import display, preview
from django_periodic.admin.actions import deletion
from django_periodic.admin.changes import explain as fire_accounts
from django_periodic.admin.changes import overrides, versions
from django_periodic.admin.forms import ScheduleForm
from django_periodic.admin.overview import overview_view
from django_periodic.admin.schedule_columns import ScheduleChangeList, ScheduleColumns
from django_periodic.admin.schedule_filters import (
    AttentionFilter,
    CodeDefinedFilter,
    LastStatusFilter,
    TriggerKindFilter,
)
from django_periodic.admin.secrets import SecretsUnfiltered, without_secrets
from django_periodic.db import clock
from django_periodic.models import Schedule, changed_by
from django_periodic.models import versions as versioning
from django_periodic.models.calendars import closures_from, closures_of
from django_periodic.models.schedule_fields import (
    ALERT_FIELDS,
    CALENDAR_FIELDS,
    JOB_FIELDS,
    LIFECYCLE_FIELDS,
    PING_FIELDS,
    POLICY_FIELDS,
    RETENTION_FIELDS,
    TRIGGER_FIELDS,
)
from django_periodic.models.trigger_rows import KIND_FIELDS

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldOpts, _FieldsetSpec
    from django_stubs_ext import StrOrPromise

# What the code of a @job schedule defines; the admin shows it but cannot change it.
CODE_DEFINED_FIELDS = (
    "name",
    "job",
    *JOB_FIELDS,
    "trigger_kind",
    *TRIGGER_FIELDS,
    *POLICY_FIELDS,
    *RETENTION_FIELDS,
    *ALERT_FIELDS,
    *PING_FIELDS,
    *LIFECYCLE_FIELDS,
)
STATE_FIELDS = (
    "attention",
    "pause_state",
    "closed_fires",
    "scope_status",
    "next_fire",
    "fires",
    "revision",
    "recent_runs",
    "last_error",
    "planning_failures",
    "defined_in",
    "created",
    "updated",
)
# Times shown read-only (a code-defined schedule's trigger, a viewer's page) through
# display.timestamp, which shows one the site's clock cannot hold in UTC; Django's own
# display of a read-only time fails the page on it.
READ_ONLY_TIMES = {"run_at": "run_time", "start_at": "start_time", "end_at": "end_time"}


@admin.register(Schedule)
class ScheduleAdmin(SecretsUnfiltered, versions.Versioned, ScheduleColumns):
    form = ScheduleForm
    list_display = [
        "name_and_error",
        "job",
        "trigger_in_words",
        "timezone",
        "enabled",
        "next_fire",
        "fires",
        "last_status",
        "attention",
        "recent_runs",
    ]
    list_display_links = ["name_and_error"]
    list_filter = [
        "enabled",
        "job",
        TriggerKindFilter,
        LastStatusFilter,
        AttentionFilter,
        CodeDefinedFilter,
        "concurrency_limit",  # listed only once a limit exists
    ]
    search_fields = ["name", "job"]
    show_full_result_count = False  # a second COUNT(*) of the whole table on every page
    actions = [
        "run_now",
        "enable",
        "resume_with_catch_up",
        "disable",
        "pause",
        "resume",
        "backfill",
    ]
    formfield_overrides = {models.DateTimeField: {"widget": display.SplitDateTime}}

    class Media:
        css = {"all": ["django_periodic/admin.css"]}
        js = ["django_periodic/schedule_form.js"]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> "_FieldsetSpec":
        trigger = ["trigger_kind", *TRIGGER_FIELDS, "trigger_preview"]
        if obj is not None and not self._editable_trigger(request, obj):
            others = {name for kind, name in KIND_FIELDS.items() if kind != obj.trigger_kind}
            trigger = [READ_ONLY_TIMES.get(name, name) for name in trigger if name not in others]
        fieldsets: list[tuple[StrOrPromise | None, _FieldOpts]] = [
            (None, {"fields": ["name", "job", *JOB_FIELDS, "enabled"]}),
            (_("Trigger"), {"fields": list(trigger)}),
            (_("Calendars"), {"fields": list(CALENDAR_FIELDS)}),
            (_("Policies"), {"fields": list(POLICY_FIELDS)}),
            (_("History"), {"fields": list(RETENTION_FIELDS)}),
            (_("Alerts"), {"fields": list(ALERT_FIELDS)}),
            (_("Ping monitor"), {"fields": list(PING_FIELDS)}),
            (_("Lifecycle"), {"fields": list(LIFECYCLE_FIELDS)}),
        ]
        if self.has_change_permission(request, obj) or obj is None:
            fieldsets.append((_("Change"), {"fields": ["version_reason"]}))  # its version's
        else:
            fieldsets = without_secrets(fieldsets)
        if obj is not None:
            # The scopes' latest runs only where there are scopes.
            hidden = set() if obj.scopes else {"scope_status"}
            fieldsets.append(
                (_("State"), {"fields": [name for name in STATE_FIELDS if name not in hidden]})
            )
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> list[str]:
        fields = ["trigger_preview", *STATE_FIELDS, *READ_ONLY_TIMES.values()]
        if obj is not None and obj.is_code_defined:
            fields += CODE_DEFINED_FIELDS
        return fields

    def _editable_trigger(self, request: HttpRequest, obj: Schedule) -> bool:
        return not obj.is_code_defined and self.has_change_permission(request, obj)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("preview/", wrap(self.preview_view), name="{}_{}_preview".format(*info)),
            path(
                "overview/",
                wrap(partial(overview_view, self)),
                name="{}_{}_overview".format(*info),
            ),
            path(
                "<path:object_id>/run-now/",
                wrap(self.run_now_view),
                name="{}_{}_run_now".format(*info),
            ),
            path(
                "<path:object_id>/override/",
                wrap(partial(overrides.override_view, self)),
                name="{}_{}_override".format(*info),
            ),
            path(
                "<path:object_id>/explain/",
                wrap(self.explain_view),
                name="{}_{}_explain".format(*info),
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # A change of when it fires shows the fires it adds, removes or moves first.
        if confirm := fire_accounts.confirmation(self, request, object_id):
            return confirm
        urls = {
            "run_now_url": self._url("run_now", object_id),
            "explain_url": self._url("explain", object_id),
            "runs_url": f"{self._url('changelist', model='run')}?schedule={object_id}",
        }
        if (obj := self.get_object(request, unquote(object_id))) is not None:
            # Its overrides and its next fires' "Skip…" and "Move…" (admin/changes/overrides.py).
            can_change = self.has_change_permission(request, obj)
            url = self._url("override", object_id)
            urls |= overrides.page_context(obj, url, can_change)
        return super().change_view(request, object_id, form_url, {**urls, **(extra_context or {})})

    # -- deleting a schedule with its history --------------------------------------------------

    def get_deleted_objects(
        self, objs: "Sequence[Schedule] | QuerySet[Schedule]", request: HttpRequest
    ) -> tuple[list[Any], dict[str, Any], set[str], list[Any]]:
        """What deleting ``objs`` deletes, as counts: runs and leases are the schedules'
        history, which whoever may delete a schedule may delete with it."""
        if not deletion.history_only():
            # A model of the project points here: Django's listing knows what it protects.
            rows, counts, needed, protected = super().get_deleted_objects(objs, request)
            history = {str(model._meta.verbose_name) for model in deletion.HISTORY}
            return rows, counts, {str(name) for name in needed} - history, protected
        schedules = list(objs)
        listed, totals = deletion.summary(schedules, self._delete_link)
        lacking = set()
        if not all(self.has_delete_permission(request, schedule) for schedule in schedules):
            lacking.add(str(self.opts.verbose_name))
        return listed, totals, lacking, []

    def _delete_link(self, schedule: Schedule) -> SafeString:
        return format_html(
            '{}: <a href="{}">{}</a>',
            capfirst(self.opts.verbose_name),
            self._url("change", schedule.pk),
            schedule,
        )

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        deletion.delete_with_history(Schedule.objects.using(obj._state.db).filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        deletion.delete_with_history(queryset)

    # -- the live preview -----------------------------------------------------------------------

    def preview_view(self, request: HttpRequest) -> HttpResponseBase:
        """The trigger being typed, in words and next fire times, as JSON (and its HTML).

        A POST of the form, so that no value typed (the job's arguments may hold secrets)
        ends up in a URL, and with it in access logs, proxies and the browser's history.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = None
        if request.GET.get("object_id"):  # which schedule: in the URL, as on its own page
            obj = self.get_object(request, unquote(request.GET["object_id"]))
            if obj is None:
                raise Http404(_("No such schedule."))
        allowed = self.has_view_or_change_permission(request, obj)
        if not (allowed or (obj is None and self.has_add_permission(request))):
            raise PermissionDenied
        form_class = self.get_form(request, obj, change=obj is not None)
        form = form_class(request.POST, instance=obj or Schedule())
        form.is_valid()
        watched = {"trigger_kind", *TRIGGER_FIELDS, "__all__"}
        errors = {
            name: [str(message) for message in field_errors]  # ErrorList gives str messages
            for name, field_errors in form.errors.items()
            if name in watched
        }
        now = clock.now(form.instance._state.db or "default")
        if "calendars" in form.fields:
            chosen = form.cleaned_data.get("calendars") or []
            closures = self._closures(lambda: closures_from(chosen), errors)
        else:  # read-only: the stored ones
            closures = self._closures(lambda: closures_of(form.instance), errors)
        result = preview.preview(form.instance, now, errors, closures)
        return JsonResponse({**result.as_json(), "html": preview.render(result)})

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        """Save it as a version by this user, for the reason given on the form (Versioned)."""
        using = obj._state.db or "default"
        # Its calendars as they were, for save_related()'s version.
        form.calendars_before = versioning.calendar_names(obj, using) if change else []
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Save its calendars; a change of them plans it again from now (as an edited
        trigger does), so that no fire they now close or open is planned by the old ones.
        The change joins the version save_model() made (or makes one)."""
        super().save_related(request, form, formsets, change)
        obj, using = form.instance, form.instance._state.db
        if "calendars" in form.changed_data:
            with changed_by(
                request.user.get_username(), form.cleaned_data.get("version_reason", "")
            ):
                versioning.record_calendars(obj, form.calendars_before, using)
        if change and "calendars" in form.changed_data:
            Schedule.objects.using(form.instance._state.db).filter(pk=form.instance.pk).reschedule()

    # -- the "Explain" page: what became of its fires ------------------------------------------

    def explain_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Each fire of a window, what became of it (admin/changes/explain.py)."""
        return fire_accounts.explain_view(self, request, object_id)  # type: ignore[no-any-return]

    # -- the "Run now" button -----------------------------------------------------------------

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """The "Run now" button of a schedule's page (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        schedule = self.get_object(request, unquote(object_id))
        if schedule is None:
            raise Http404(_("No such schedule."))
        if not self.has_change_permission(request, schedule):
            raise PermissionDenied
        try:
            runs = schedule.run_now_for_all_scopes()
        except ValidationError as exc:  # a value stored out of its range
            message = _("Not run: %(error)s") % {"error": schedule_actions.refusal(exc)}
            self.message_user(request, message, messages.ERROR)
            return HttpResponseRedirect(self._url("change", schedule.pk))
        except Exception as exc:  # the scope provider's code failed
            message = _("Not run: its scope provider failed: %(error)s") % {"error": exc}
            self.message_user(request, message, messages.ERROR)
            return HttpResponseRedirect(self._url("change", schedule.pk))
        if len(runs) == 1:
            (run,) = runs
            link = format_html('<a href="{}">{}</a>', self._url("change", run.pk, model="run"), run)
            self.message_user(request, format_html(_("Requested a run: {}."), link))
        else:
            schedule_actions.report_requested(self, request, Counter(run.status for run in runs))
        return HttpResponseRedirect(self._url("change", schedule.pk))

    # -- the list's actions -------------------------------------------------------------------

    # Defined in admin/actions; set here by name, where the admin looks actions up.
    run_now = schedule_actions.run_now
    enable = schedule_actions.enable
    resume_with_catch_up = schedule_actions.resume_with_catch_up
    disable = schedule_actions.disable
    pause = schedule_actions.pause
    resume = schedule_actions.resume
    backfill = schedule_actions.backfill
