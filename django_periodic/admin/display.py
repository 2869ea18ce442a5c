"""How the console shows the ledger: status badges, run strips, times, durations and JSON.

Also what a value shows when it cannot be shown: rows stored past validation (raw SQL, an
older version, a job since removed) may hold anything, and one odd row must not turn the
page that lists it into an error page. Its cell says why instead (``or_invalid``), and a
time too close to the limits of Python's datetime for the site's time zone is shown in UTC
(``local``).
"""

import functools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any, ParamSpec, TypeVar

from django.contrib import admin
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Field, Model
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _

from django_periodic.admin.history import RunSummary, ScopeRun
from django_periodic.models import Run, Schedule
from django_periodic.models.pausing import UNTIL_RESUMED, pause_note

EMPTY = "—"

# What rendering an odd stored value raises: a time shifted past datetime.max or min
# (OverflowError), a value of the wrong type, a trigger that cannot be built (InvalidTrigger
# is a ValueError).
UNRENDERABLE = (ArithmeticError, LookupError, TypeError, ValueError)

P = ParamSpec("P")
R = TypeVar("R")


def invalid(reason: object) -> SafeString:
    """What a cell shows for a value it cannot render: why, in a few words."""
    text = _("invalid: %(reason)s") % {"reason": reason}
    return format_html('<span class="periodic-invalid">{}</span>', text)


def or_invalid(render: Callable[P, R]) -> Callable[P, R | SafeString]:
    """A display method that shows ``invalid(reason)`` for a row it cannot render, instead
    of failing the whole page."""

    @functools.wraps(render)
    def cell(*args: P.args, **kwargs: P.kwargs) -> R | SafeString:
        try:
            return render(*args, **kwargs)
        except UNRENDERABLE as exc:
            return invalid(exc)

    return cell


def local(value: datetime, zone: tzinfo | None = None) -> datetime:
    """``value`` on the wall clock of ``zone`` (default: the site's), or in UTC where that
    clock would pass datetime.max or min (a time stored near them, past validation)."""
    if timezone.is_naive(value):
        return value  # a naive time (USE_TZ off) is already on the site's clock
    try:
        return value.astimezone(zone or timezone.get_current_timezone())
    except OverflowError:
        return value.astimezone(UTC)


def status_label(status: str) -> str:
    try:
        return str(Run.Status(status).label)
    except ValueError:  # a value written by something newer, or by hand
        return status


def badge(tone: str, text: str, title: str = "") -> SafeString:
    """A coloured pill; ``tone`` is a run status, whose colours admin.css takes from the
    admin's palette (so dark mode works)."""
    return format_html(
        '<span class="periodic-badge periodic-status-{}" title="{}">{}</span>',
        tone,
        title or text,
        text,
    )


def status_badge(status: str, title: str = "") -> SafeString:
    """A run status as a badge."""
    return badge(status, status_label(status), title)


def counts(statuses: Counter[str]) -> str:
    """How many runs ended up in each status, e.g. "2 pending, 1 skipped"."""
    return ", ".join(f"{n} {status_label(status)}" for status, n in sorted(statuses.items()))


def run_strip(runs: Sequence[RunSummary], change_url: str) -> SafeString:
    """Small squares for ``runs`` (newest first), drawn oldest to newest, each a link.

    ``change_url`` is a run's change page with "0" as the id: reversing a URL per square
    would cost more than the rest of the row, as would translating a label per square.
    """
    prefix = change_url.removesuffix("0/change/")
    labels = {value: str(label) for value, label in (*Run.Status.choices, *Run.Trigger.choices)}
    squares = format_html_join(
        "",
        '<a class="periodic-square periodic-status-{}" href="{}{}/change/" title="{}"></a>',
        (
            (run.status, prefix, run.pk, _square_title(run, labels))
            for run in reversed(runs)  # oldest first, so the newest is at the right
        ),
    )
    return format_html('<span class="periodic-strip">{}</span>', squares)


# The scopes a schedule's page lists one by one; the rest are counted.
SCOPE_TABLE_ROWS = 20
# Listed first: the scopes whose latest run needs a look.
ATTENTION_FIRST = (Run.Status.FAILED, Run.Status.RETRYING, Run.Status.CANCELLED)


def scope_table(
    latest: Sequence[ScopeRun], complete: bool, runs_url: str, change_url: str
) -> SafeString:
    """The latest run of each scope: counts by status, then a table of the first
    ``SCOPE_TABLE_ROWS`` scopes, those that need a look first, each linking its runs.

    ``runs_url`` lists the schedule's runs (a scope filter is added per row); ``change_url``
    is a run's change page with "0" as the id.
    """
    if not latest:
        return format_html('<span class="periodic-quiet">{}</span>', _("no scoped run yet"))
    total = _("%(n)d scopes: %(counts)s.") % {
        "n": len(latest),
        "counts": counts(Counter(run.status for run in latest)),
    }
    if not complete:
        total += " " + _("(Latest run of each scope among its newest runs only.)")
    ordered = sorted(latest, key=lambda run: (run.status not in ATTENTION_FIRST, run.scope))
    rows_shown = ordered[:SCOPE_TABLE_ROWS]
    prefix = change_url.removesuffix("0/change/")
    rows = format_html_join(
        "",
        '<tr><td><a href="{}&amp;{}">{}</a></td><td><a href="{}{}/change/">{}</a></td>'
        "<td>{}</td></tr>",
        (
            (
                runs_url,
                urlencode({"scope": run.scope}),
                run.scope,
                prefix,
                run.pk,
                status_badge(run.status, run.error_code),
                absolute(run.plan_time),
            )
            for run in rows_shown
        ),
    )
    more = ""
    if len(ordered) > len(rows_shown):
        more = format_html(
            '<p><a href="{}">{}</a></p>',
            runs_url,
            _("%(n)d more scopes: all runs of this schedule")
            % {"n": len(ordered) - SCOPE_TABLE_ROWS},
        )
    return format_html(
        '<p>{}</p><table class="periodic-scopes"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "</tr></thead><tbody>{}</tbody></table>{}",
        total,
        _("scope"),
        _("latest run"),
        _("plan time"),
        rows,
        more,
    )


def _square_title(run: RunSummary, labels: dict[str, str]) -> str:
    words = [labels.get(run.status, run.status), absolute(run.plan_time)]
    words.append(labels.get(run.trigger, run.trigger))
    if run.schedule_revision is not None:
        words.append(_("revision %(number)d") % {"number": run.schedule_revision})
    if run.error_code:
        words.append(run.error_code)
    return " · ".join(words)


def relative(value: datetime | None, now: datetime) -> str:
    """A time relative to ``now``, e.g. "in 3 minutes" or "12 s ago".

    timesince alone would say "0 minutes" for anything under a minute.
    """
    if value is None:
        return EMPTY
    seconds = (value - now).total_seconds()
    if abs(seconds) < 60:
        amount = _("%(n)d s") % {"n": round(abs(seconds))}
    elif seconds > 0:
        amount = timeuntil(value, now, depth=1)
    else:
        amount = timesince(value, now, depth=1)
    if seconds > 0:
        return _("in %(amount)s") % {"amount": amount}
    return _("%(amount)s ago") % {"amount": amount}


def absolute(value: datetime | None) -> str:
    """A time in the site's time zone, compact and unambiguous for tables.

    strftime, not Django's date formats: a page of run strips formats thousands of times.
    """
    if value is None:
        return EMPTY
    return local(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def when(value: datetime | None, now: datetime) -> SafeString:
    """Relative time over absolute time (its zone in the tooltip, to keep columns narrow)."""
    if value is None:
        return format_html("{}", EMPTY)
    return format_html(
        '<span class="periodic-when" title="{}">{}<br>'
        '<span class="periodic-quiet">{}</span></span>',
        absolute(value),
        relative(value, now),
        local(value).strftime("%Y-%m-%d %H:%M:%S"),
    )


def pause(schedule: Schedule) -> SafeString:
    """A schedule's pause: until when, and in the tooltip who paused it and why."""
    until = schedule.paused_until
    if until is None:
        return format_html("{}", EMPTY)
    ended = "" if schedule.is_paused(timezone.now()) else _(" (ended)")
    resumed = until >= UNTIL_RESUMED  # paused_after_failures: until someone resumes it
    return format_html(
        '<span class="periodic-paused" title="{}">{} {}{}<br>'
        '<span class="periodic-quiet">{}</span></span>',
        pause_note(until, schedule.pause_reason, schedule.paused_by),
        _("paused until"),
        _("resumed") if resumed else local(until).strftime("%Y-%m-%d %H:%M:%S"),
        ended,
        schedule.pause_reason[:80],
    )


def attention(schedule: Schedule) -> SafeString:
    """Why a schedule needs attention, and since when in the tooltip; "—" if it does not."""
    since = schedule.attention_since
    if not schedule.attention_reason:
        return format_html("{}", EMPTY)
    title = _("since %(time)s") % {"time": absolute(since)} if since else ""
    return format_html(
        '<span class="periodic-attention" title="{}">⚠ {}</span>',
        title,
        schedule.attention_note,
    )


def duration(value: timedelta | None) -> str:
    """A short duration: "850 ms", "12.3 s", "4 min 5 s", "2 h 3 min"; signed."""
    if value is None:
        return EMPTY
    sign, seconds = ("-" if value < timedelta(0) else ""), abs(value.total_seconds())
    if seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 60:
        text = f"{seconds:.1f} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min {int(seconds % 60)} s"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    else:
        text = f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"
    return sign + text


def pretty_json(value: Any) -> SafeString:
    """JSON indented in a <pre>, in the admin's monospace."""
    if value is None:
        return format_html("{}", EMPTY)
    text = json.dumps(value, indent=2, ensure_ascii=False, cls=DjangoJSONEncoder)
    return format_html('<pre class="periodic-pre">{}</pre>', text)


def preformatted(text: str) -> SafeString:
    """Text whose line breaks and indentation matter (a traceback)."""
    if not text:
        return format_html("{}", EMPTY)
    return format_html('<pre class="periodic-pre">{}</pre>', text)


class SplitDateTime(AdminSplitDateTime):
    """The admin's date and time inputs; a time the site's clock cannot hold (near
    datetime.max or min) is filled in in UTC, where Django's inputs would fail the page.
    Such a time is out of range: the form refuses it on save, whichever clock it is read on."""

    def decompress(self, value: datetime | None) -> tuple[date | None, time | None]:
        if value:
            shown = local(value)
            return shown.date(), shown.time()
        return None, None


def timestamp(model: type[Model], name: str) -> Callable[[object, Model], str]:
    """A read-only display of a datetime field to the second (the admin's stops at minutes)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field)  # a datetime field, not the far side of a relation

    @admin.display(description=field.verbose_name, ordering=name)
    def show(self: object, obj: Model) -> str:
        return absolute(getattr(obj, name))

    return show
