"""A schedule's fires in the admin: the "Explain" page (each fire of a window, what became of
it, linking its run; a page of fires at a time, linking the next), and the confirmation a
change of when it fires asks for before it is saved (the fires it adds, removes or moves:
``Schedule.fire_diff()``).

The confirmation is a page rendered instead of saving: an existing schedule's form, POSTed
valid with a change that moves its fires (and without ``CONFIRMED``), shows the diff with
the form's data in hidden fields; "Save" posts them again with ``CONFIRMED``, "Go back"
returns to the form as it was typed.
"""

from datetime import datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_periodic.admin.actions.backfill import DateTimeInput
from django_periodic.db import clock
from django_periodic.models import ExplainPage, FireAccount, Schedule
from django_periodic.models.explaining.fire_diff import DIFFABLE
from django_periodic.operations import explain as explain_output
from django_periodic.timing import triggers
from django_periodic.timing.fire_diff import FireDiff

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

EXPLAIN_TEMPLATE = "admin/django_periodic/schedule/explain.html"
CONFIRM_TEMPLATE = "admin/django_periodic/schedule/fire_diff.html"
# The field of a POSTed form that says its diff was seen and confirmed.
CONFIRMED = "_confirmed_diff"
# How far ahead the confirmation looks: 30 days, or up to its 1,000th fire if sooner (a
# page to read, and computed while the operator waits).
DIFF_DAYS = 30
DIFF_FIRES = 1_000
CUSTOM = "custom"
# The query parameter of a page's link: the last time the page before it covers.
AFTER = "after"


class WindowForm(forms.Form):
    """The window chooser: the last day, the last week, or since and until."""

    window = forms.ChoiceField(
        label=gettext_lazy("Window"),
        choices=[
            ("24h", gettext_lazy("Last 24 hours")),
            ("7d", gettext_lazy("Last 7 days")),
            (CUSTOM, gettext_lazy("From … to …")),
        ],
        initial=explain_output.DEFAULT_WINDOW,
        required=False,
    )
    since = forms.DateTimeField(label=gettext_lazy("From"), widget=DateTimeInput(), required=False)
    until = forms.DateTimeField(label=gettext_lazy("To"), widget=DateTimeInput(), required=False)

    def window_at(self, now: datetime) -> explain_output.Window:
        """The window chosen; raises ValueError for a custom one that is not a window."""
        data = self.cleaned_data
        if data.get("window") != CUSTOM:
            return explain_output.window(now, named=data.get("window") or "24h")
        since, until = data.get("since"), data.get("until")
        if since is None or until is None:
            raise ValueError(_("Give both ends of the window."))
        if until <= since:
            raise ValueError(_("The window must end after it starts."))
        return explain_output.Window(since, until)


def explain_view(model_admin: "ModelAdmin[Schedule]", request: HttpRequest, object_id: str) -> Any:
    """The "Explain" page of a schedule (GET; view permission suffices): a page of the fires
    of the window chosen, linking the next. A window that is not one is answered at once,
    400, saying why."""
    schedule = model_admin.get_object(request, unquote(object_id))
    if schedule is None:
        raise Http404(_("No such schedule."))
    if not model_admin.has_view_or_change_permission(request, schedule):
        raise PermissionDenied
    form = WindowForm(request.GET or None)
    now = clock.now(schedule._state.db or "default")
    page: ExplainPage | None = None
    error, status = "", HTTPStatus.OK
    if form.is_bound and not form.is_valid():
        error, status = _("Choose a window."), HTTPStatus.BAD_REQUEST
    else:
        try:
            asked = form.window_at(now) if form.is_bound else explain_output.window(now)
            page = schedule.explain_page(asked.since, asked.until, after=_after(request))
        except triggers.InvalidTrigger as exc:  # the schedule's trigger or calendars
            error = str(exc)
        except ValueError as exc:  # the window asked: refused before any fire is read
            error, status = str(exc), HTTPStatus.BAD_REQUEST
    site = model_admin.admin_site.name
    accounts = page.accounts if page is not None else ()
    rows = [
        (account, explain_output.tone(account), _run_url(site, account)) for account in accounts
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "original": schedule,
        "title": _("What became of the fires of %(name)s") % {"name": schedule},
        "form": form,
        "page": page,
        "rows": rows,
        "next_url": _page_url(request, page.next_after) if page and page.next_after else "",
        "first_url": _page_url(request, None) if page and page.after else "",
        "error": error,
        "current_timezone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, EXPLAIN_TEMPLATE, context, status=status)


def _after(request: HttpRequest) -> datetime | None:
    """Where the page asked for continues: the last time the page before it covers (its
    link's ``after``, ISO 8601), or None for the first page."""
    text = request.GET.get(AFTER, "")
    if not text:
        return None
    try:
        after = parse_datetime(text)
    except ValueError:
        after = None
    if after is None or timezone.is_naive(after):
        raise ValueError(_("Not a page of this window: %(after)s.") % {"after": text})
    return after


def _page_url(request: HttpRequest, after: datetime | None) -> str:
    """The link to the page of the same window that continues after ``after`` (None: the
    first page)."""
    query = request.GET.copy()
    query.pop(AFTER, None)
    if after is not None:
        query[AFTER] = after.isoformat()
    return f"?{query.urlencode()}"


def _run_url(site: str, account: FireAccount) -> str:
    if account.run_id is None:
        return ""
    return reverse(f"{site}:django_periodic_run_change", args=[account.run_id])


def confirmation(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, object_id: str
) -> HttpResponse | None:
    """The page to confirm a POSTed change of when a schedule fires, or None: save as
    usual (no such change, a form Django will refuse, or one confirmed already)."""
    if request.method != "POST" or CONFIRMED in request.POST:
        return None
    saved = model_admin.get_object(request, unquote(object_id))
    if saved is None or not model_admin.has_change_permission(request, saved):
        return None  # Django's own view says why
    edited = model_admin.get_object(request, unquote(object_id))
    assert edited is not None
    form_class = model_admin.get_form(request, edited, change=True)
    form = form_class(request.POST, request.FILES, instance=edited)
    if not form.is_valid():
        return None  # shown with its errors by Django's view
    diff = _diff(saved, form)
    if not diff:
        return None
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "original": saved,
        "title": _("Confirm the change of %(name)s") % {"name": saved},
        "diff": diff,
        "days": DIFF_DAYS,
        "hidden": [(key, value) for key, values in request.POST.lists() for value in values],
        "confirmed": CONFIRMED,
        "current_timezone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def _diff(saved: Schedule, form: forms.ModelForm) -> FireDiff | None:  # type: ignore[type-arg]
    """What the form's changes of when it fires do to its next fires (None: none)."""
    # The instance as the form will save it (the form clears the other kinds' fields).
    changes: dict[str, Any] = {
        name: getattr(form.instance, name)
        for name in sorted(DIFFABLE - {"calendars", "overrides"})
        if getattr(form.instance, name, None) != getattr(saved, name, None)
    }
    if "calendars" in form.changed_data:
        changes["calendars"] = list(form.cleaned_data["calendars"])
    if not changes:
        return None
    try:
        return saved.fire_diff(days=DIFF_DAYS, max_fires=DIFF_FIRES, **changes)
    except (ValueError, triggers.InvalidTrigger):
        return None  # nothing to show: the model's own validation has the last word
