"""The schedule pages' columns and read-only fields: the list's (name, trigger in words, next
fire, last run, recent runs, ...) and those of a schedule's page (its state, the trigger's
preview). ScheduleAdmin builds on ScheduleColumns."""

from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.admin import display, history, preview
from django_periodic.admin.forms import KIND_LABELS
from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.models import Run, Schedule
from django_periodic.models.calendars import closures_of
from django_periodic.timing import triggers
from django_periodic.timing.business_days import Closures

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    # django-stubs makes ModelAdmin generic; at run time it takes no type arguments.
    _ScheduleAdmin = admin.ModelAdmin[Schedule]
else:
    _ScheduleAdmin = admin.ModelAdmin


class RecentRuns(TypedDict):
    """What ScheduleChangeList (or ScheduleColumns._recent, on a schedule's own page) sets on
    each schedule."""

    recent: list[history.RunSummary]


class ScheduleChangeList(ChangeList):
    """Loads the recent runs of every schedule on the page in one query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        schedules = list(self.result_list)
        runs = history.recent_runs([s.pk for s in schedules], using=self.queryset.db)
        for schedule in schedules:
            schedule.recent = runs.get(schedule.pk, [])


class ScheduleColumns(_ScheduleAdmin):
    """The columns and read-only fields of ScheduleAdmin, which names them in its
    ``list_display``, fieldsets and read-only fields; and ``_url``, the admin's URLs, which
    both use."""

    run_time = display.timestamp(Schedule, "run_at")
    start_time = display.timestamp(Schedule, "start_at")
    end_time = display.timestamp(Schedule, "end_at")
    created = display.timestamp(Schedule, "created_at")
    updated = display.timestamp(Schedule, "updated_at")

    def _url(self, name: str, *args: object, model: str = "schedule") -> str:
        app = self.opts.app_label
        return reverse(f"{self.admin_site.name}:{app}_{model}_{name}", args=args)

    @admin.display(description=gettext_lazy("name"), ordering="name")
    def name_and_error(self, schedule: Schedule) -> str:
        if not schedule.last_error:
            return schedule.name
        return format_html(
            '{}<div class="periodic-error" title="{}">⚠ {}</div>',
            schedule.name,
            schedule.last_error,
            schedule.last_error[:120],
        )

    @admin.display(description=gettext_lazy("trigger"))
    def trigger_in_words(self, schedule: Schedule) -> str:
        words = self._in_words(schedule)
        if not schedule.cron:
            return words
        return format_html('{}<br><code class="periodic-quiet">{}</code>', words, schedule.cron)

    @display.or_invalid
    def _in_words(self, schedule: Schedule) -> str:
        schedule.trigger  # noqa: B018 (building it validates it: an invalid one says why)
        return preview.describe(schedule, bounds=False) or display.EMPTY

    @admin.display(description=gettext_lazy("trigger kind"))
    def trigger_kind(self, schedule: Schedule) -> str:
        return str(KIND_LABELS.get(schedule.trigger_kind, display.EMPTY))

    @admin.display(description=gettext_lazy("next fire"), ordering="next_fire_at")
    @display.or_invalid
    def next_fire(self, schedule: Schedule) -> SafeString:
        if not schedule.enabled:
            return format_html('<span class="periodic-quiet">{}</span>', _("disabled"))
        if schedule.is_paused(clock.wall_now()):
            return display.pause(schedule)
        if schedule.next_fire_at is None:
            ended = schedule.runs_note if schedule.has_ended else _("no more fires")
            return format_html('<span class="periodic-quiet">{}</span>', ended)
        if schedule.is_unplanned:  # stored without save(); the planner plans it first
            return format_html('<span class="periodic-quiet">{}</span>', _("not planned yet"))
        return display.when(schedule.next_fire_at, clock.wall_now())

    @admin.display(description=gettext_lazy("fires"), ordering="fire_count")
    def fires(self, schedule: Schedule) -> str:
        """Its fires run so far, of its max_runs: "3 of 10 runs" (models/schedule_fields.py)."""
        return schedule.runs_note

    @admin.display(description=gettext_lazy("attention"), ordering="attention_since")
    def attention(self, schedule: Schedule) -> SafeString:
        return display.attention(schedule)

    @admin.display(description=gettext_lazy("pause"))
    def pause_state(self, schedule: Schedule) -> SafeString:
        return display.pause(schedule)

    @admin.display(description=gettext_lazy("closed fires"))
    def closed_fires(self, schedule: Schedule) -> SafeString:
        """Its closed spans: one skipped run (code ``closed``) each; how many, and the last."""
        runs = Run.objects.using(schedule._state.db or "default")
        closed = runs.filter(schedule=schedule.pk, error_code=ErrorCode.CLOSED)
        count = closed.count()
        last = closed.order_by("-plan_time").only("plan_time", "error_message").first()
        if last is None:
            return format_html('<span class="periodic-quiet">{}</span>', _("none"))
        return format_html(
            '{} <span class="periodic-quiet">({}: {} UTC, {})</span>',
            count,
            _("last"),
            f"{last.plan_time:%Y-%m-%d %H:%M:%S}",
            last.error_message,
        )

    @admin.display(description=gettext_lazy("last run"))
    def last_status(self, schedule: "WithAnnotations[Schedule, RecentRuns]") -> SafeString:
        runs = self._recent(schedule)
        if not runs:
            return format_html('<span class="periodic-quiet">{}</span>', _("never ran"))
        return display.status_badge(runs[0].status, runs[0].error_code)

    @admin.display(description=gettext_lazy("recent runs"))
    def recent_runs(self, schedule: "WithAnnotations[Schedule, RecentRuns]") -> str:
        runs = self._recent(schedule)
        if not runs:
            return display.EMPTY
        return display.run_strip(runs, self._url("change", 0, model="run"))

    def _recent(
        self, schedule: "WithAnnotations[Schedule, RecentRuns]"
    ) -> list[history.RunSummary]:
        if schedule.pk is None:
            return []
        if not hasattr(schedule, "recent"):  # the change page: one schedule, one query
            using = schedule._state.db or "default"
            schedule.recent = history.recent_runs([schedule.pk], using).get(schedule.pk, [])
        return schedule.recent

    @admin.display(description=gettext_lazy("scopes"))
    def scope_status(self, schedule: Schedule) -> SafeString:
        """The latest run of each scope: a count by status, then the scopes that need a look
        first (failed, retrying), capped."""
        using = schedule._state.db or "default"
        latest, complete = history.latest_by_scope(schedule.pk, using)
        runs_url = f"{self._url('changelist', model='run')}?schedule={schedule.pk}"
        return display.scope_table(latest, complete, runs_url, self._url("change", 0, model="run"))

    @admin.display(description=gettext_lazy("preview"))
    @display.or_invalid
    def trigger_preview(self, schedule: Schedule) -> SafeString:
        now = clock.now(schedule._state.db or "default")
        errors = self._trigger_errors(schedule)
        closures = self._closures(lambda: closures_of(schedule), errors)
        result = preview.preview(schedule, now, errors, closures)
        url = self._url("preview")
        if schedule.pk is not None:
            url += f"?object_id={schedule.pk}"
        return format_html(
            '<div id="periodic-preview" class="periodic-preview" data-url="{}" '
            'aria-live="polite">{}</div>',
            url,
            preview.render(result),
        )

    @staticmethod
    def _closures(
        load: "Callable[[], Closures | None]", errors: dict[str, list[str]]
    ) -> Closures | None:
        """The calendars' rules, or None with why they cannot be used added to ``errors``."""
        try:
            return load()
        except triggers.InvalidTrigger as exc:
            errors.setdefault("calendars", []).append(str(exc))
            return None

    @staticmethod
    def _trigger_errors(schedule: Schedule) -> dict[str, list[str]]:
        try:
            schedule.trigger  # noqa: B018 (building it validates it)
        except triggers.InvalidTrigger as exc:
            return {"__all__": [str(exc)]} if schedule.trigger_kind else {}
        return {}
