"""Single-fire overrides on a schedule's page: its overrides listed, its next fires with
"Skip…" and "Move…", each a small form asking why (and where to), and the marks the
preview of the next fires shows on overridden ones (docs/overrides.md).

Permission: changing schedules. A fire the model refuses to override is left as it was, and
the form says why.
"""

from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.admin.actions.backfill import DateTimeInput
from django_periodic.db import clock
from django_periodic.models import FireOverride, Schedule
from django_periodic.timing import bounds, triggers

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEMPLATE = "admin/django_periodic/schedule/override.html"
ACTIONS = (FireOverride.Action.SKIP, FireOverride.Action.MOVE)
UPCOMING = 10  # the next fires listed with their actions


class FireForm(forms.Form):
    """The fire a "Skip…" or "Move…" link names, from its query (``at``: its plan time)."""

    at = forms.DateTimeField()

    def clean_at(self) -> datetime:
        """A time an override may name (as ``FireOverride.clean()`` has it), checked before
        anything converts it to UTC or shows it: out of range, that overflows."""
        at: datetime = self.cleaned_data["at"]
        if message := bounds.TIMES.error("at", at):
            raise ValidationError(message)
        return at


class OverrideForm(forms.Form):
    move_to = forms.DateTimeField(
        label=gettext_lazy("Run it at"),
        widget=DateTimeInput(),
        help_text=gettext_lazy("Between the fires before and after it, within 7 days."),
    )
    reason = forms.CharField(
        label=gettext_lazy("Why"), max_length=500, widget=forms.Textarea(attrs={"rows": 2})
    )

    def __init__(self, *args: Any, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if action == FireOverride.Action.SKIP:
            del self.fields["move_to"]


@dataclass(frozen=True)
class UpcomingFire:
    """One of the next fires on the schedule's page: its time and what overrides it."""

    utc: datetime
    override: FireOverride | None
    skip_url: str = ""
    move_url: str = ""


def marks(schedule: Schedule, times: list[datetime]) -> dict[datetime, FireOverride]:
    """The overrides of these fires of a saved schedule, by plan time (one query)."""
    if schedule.pk is None or not times:
        return {}
    found = FireOverride.objects.using(schedule._state.db).filter(
        schedule_id=schedule.pk, plan_time__in=times
    )
    return {override.plan_time: override for override in found}


def mark_text(override: FireOverride) -> str:
    """An overridden fire in the preview: skipped, or where it runs, with why and who."""
    who = _(" by %(by)s") % {"by": override.by} if override.by else ""
    if override.move_to is None:
        return _("skipped%(who)s: %(why)s") % {"who": who, "why": override.reason}
    when = timezone.localtime(override.move_to).strftime("%Y-%m-%d %H:%M:%S %Z")
    return _("moved to %(when)s%(who)s: %(why)s") % {
        "when": when,
        "who": who,
        "why": override.reason,
    }


def page_context(schedule: Schedule, url: str, can_change: bool) -> dict[str, Any]:
    """The overrides section of a schedule's page: its overrides, and its next fires with
    their actions (``url`` is the override view's, for a user who may change it)."""
    try:
        times = schedule.next_fire_times(UPCOMING, clock.now(schedule._state.db or "default"))
    except (triggers.InvalidTrigger, ValueError, OverflowError):
        times = []  # the preview says why
    found = marks(schedule, times)
    upcoming = []
    for utc in times:
        if can_change and utc not in found:
            skip, move = (
                f"{url}?{urlencode({'action': a, 'at': utc.isoformat()})}" for a in ACTIONS
            )
            upcoming.append(UpcomingFire(utc, None, skip, move))
        else:
            upcoming.append(UpcomingFire(utc, found.get(utc)))
    overrides = list(schedule.overrides.order_by("-plan_time")[:50])
    return {"upcoming_fires": upcoming, "fire_overrides": overrides}


def override_view(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """ "Skip…" or "Move…" one fire (``?action=skip|move&at=<plan time>``): the form, then
    the override made, logged in the schedule's history."""
    schedule = model_admin.get_object(request, unquote(object_id))
    if schedule is None:
        raise Http404(_("No such schedule."))
    if not model_admin.has_change_permission(request, schedule):
        raise PermissionDenied
    action = request.GET.get("action", "")
    if action not in ACTIONS:
        raise Http404(_("No such fire."))
    fire = FireForm(request.GET)
    form = OverrideForm(request.POST if request.method == "POST" else None, action=action)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Skip a fire") if action == FireOverride.Action.SKIP else _("Move a fire"),
        "opts": model_admin.model._meta,
        "original": schedule,
        "fire": fire,
        "form": form,
        "action": action,
        "current_timezone": timezone.get_current_timezone_name(),
    }
    if not fire.is_valid():  # answered at once, saying why
        return TemplateResponse(request, TEMPLATE, context, status=HTTPStatus.BAD_REQUEST)
    plan_time = fire.cleaned_data["at"]
    if (
        request.method == "POST"
        and form.is_valid()
        and _applied(model_admin, request, schedule, action, plan_time, form)
    ):
        opts = model_admin.opts
        change = f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_change"
        return HttpResponseRedirect(reverse(change, args=[schedule.pk]))
    context["plan_time"] = timezone.localtime(plan_time)
    return TemplateResponse(request, TEMPLATE, context)


def _applied(
    model_admin: "ModelAdmin[Schedule]",
    request: HttpRequest,
    schedule: Schedule,
    action: str,
    plan_time: datetime,
    form: OverrideForm,
) -> bool:
    """Make the override; False, with its errors on the form, when the model refuses it."""
    reason, by = form.cleaned_data["reason"], request.user.get_username()
    try:
        if action == FireOverride.Action.SKIP:
            made = schedule.skip_fire(plan_time, reason, by=by)
        else:
            made = schedule.move_fire(plan_time, form.cleaned_data["move_to"], reason, by=by)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, messages)
        return False
    note = _("Fire overridden: %(what)s") % {"what": mark_text(made)}
    model_admin.log_change(request, schedule, note)
    model_admin.message_user(request, note)
    return True
