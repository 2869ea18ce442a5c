"""The overview's per-schedule pictures, as inline SVG: its last runs as a strip of cells
(colour: the outcome; height: the duration, relative to the strip's longest; each a link to
its run with a tooltip), and its next fires on a timeline of the next 24 hours."""

from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from html import escape  # the standard library's: Django's is lazy-aware, and slower
from math import sqrt

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_periodic.admin import display
from django_periodic.admin.history import RunSummary
from django_periodic.admin.overview.charts import number
from django_periodic.admin.overview.sections import AHEAD, STRIP_RUNS, Timeline
from django_periodic.models import Run

CELL, GAP, STRIP_HEIGHT, STUB = 9, 2, 28, 6
TIMELINE_WIDTH, TIMELINE_HEIGHT = 480, 20


def strip(runs: Sequence[RunSummary], change_url: str, name: str) -> SafeString:
    """Cells for ``runs`` (newest first), drawn oldest to newest, the newest at the right.

    ``change_url`` is a run's change page with "0" as the id (one reverse per page). The
    cells are written with one escape each: a page draws 2,500, and format_html's escape of
    every argument would cost more than the page's queries.
    """
    prefix = escape(change_url.removesuffix("0/change/"))
    longest = max((run.duration for run in runs if run.duration), default=None)
    labels = {value: str(label) for value, label in Run.Status.choices}
    zone = timezone.get_current_timezone()
    width = STRIP_RUNS * (CELL + GAP)
    first = width - len(runs) * (CELL + GAP)
    cells = "".join(
        _cell(run, first + i * (CELL + GAP), longest, prefix, (labels, zone))
        for i, run in enumerate(reversed(runs))
    )
    label = _("Last %(n)d runs of %(name)s") % {"n": len(runs), "name": name}
    return format_html(
        '<svg class="periodic-runs" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img"'
        ' aria-label="{}"><title>{}</title>{}</svg>',
        label,
        label,
        mark_safe(cells),  # each cell's text escaped by _cell
        w=width,
        h=STRIP_HEIGHT,
    )


# What a cell's title reads once per strip: the statuses' labels, the site's time zone.
Shown = tuple[dict[str, str], tzinfo]


def _cell(run: RunSummary, x: int, longest: timedelta | None, prefix: str, shown: Shown) -> str:
    height = _height(run.duration, longest)
    return (
        f'<a href="{prefix}{int(run.pk)}/change/"><rect class="periodic-cell'
        f' periodic-cell-{escape(run.status)}" x="{x}" y="{number(STRIP_HEIGHT - height)}"'
        f' width="{CELL}" height="{number(height)}"><title>{escape(_title(run, shown))}'
        "</title></rect></a>"
    )


def _height(duration: timedelta | None, longest: timedelta | None) -> float:
    """A stub without a duration; else up to the full height, by the square root of its
    share of the longest (a 1 s run beside a 100 s one stays visible)."""
    if not duration or not longest:
        return STUB
    return STUB + (STRIP_HEIGHT - STUB) * sqrt(max(duration / longest, 0.0))


def _title(run: RunSummary, shown: Shown) -> str:
    labels, zone = shown
    parts = [
        f"#{run.pk}",
        labels.get(run.status, run.status),
        display.local(run.plan_time, zone).strftime("%Y-%m-%d %H:%M:%S"),
    ]
    if run.duration is not None:
        parts.append(display.duration(run.duration))
    if run.error_code:
        parts.append(run.error_code)
    return " · ".join(parts)


def _x(moment: datetime, now: datetime) -> float:
    return TIMELINE_WIDTH * ((moment - now) / AHEAD)


def timeline(line: Timeline, now: datetime, name: str) -> SafeString:
    """A tick per fire in the next 24 hours; past the fires computed, a band to the end."""
    if line.note:
        return format_html('<span class="periodic-quiet">{}</span>', line.note)
    # One escape per tick, as the strip's cells (up to 5,000 a page).
    zone = timezone.get_current_timezone()
    ticks = mark_safe(  # each tick's text escaped
        "".join(
            f'<rect class="periodic-fire" x="{number(_x(fire, now))}" y="3" width="2"'
            f' height="{TIMELINE_HEIGHT - 6}"><title>{escape(_fire_title(fire, zone))}'
            "</title></rect>"
            for fire in line.fires
        )
    )
    band = ""
    if line.more:
        start = _x(line.fires[-1], now) if line.fires else 0.0
        band = format_html(
            '<rect class="periodic-fire-band" x="{}" y="3" width="{}" height="{}">'
            "<title>{}</title></rect>",
            number(start),
            number(TIMELINE_WIDTH - start),
            TIMELINE_HEIGHT - 6,
            _("and more fires: over %(n)d in 24 hours") % {"n": len(line.fires)},
        )
    label = _("%(n)s fires of %(name)s in the next 24 hours") % {
        "n": f"{len(line.fires)}+" if line.more else len(line.fires),
        "name": name,
    }
    return format_html(
        '<svg class="periodic-timeline" viewBox="0 0 {w} {h}" width="{w}" height="{h}"'
        ' role="img" aria-label="{}"><title>{}</title>{}{}{}</svg>',
        label,
        label,
        _grid(),
        ticks,
        band,
        w=TIMELINE_WIDTH,
        h=TIMELINE_HEIGHT,
    )


def _fire_title(fire: datetime, zone: tzinfo) -> str:
    return display.local(fire, zone).strftime("%a %Y-%m-%d %H:%M:%S")


def _grid() -> SafeString:
    return format_html_join(
        "",
        '<line class="periodic-chart-axis" x1="{0}" y1="0" x2="{0}" y2="{1}"/>',
        ((number(TIMELINE_WIDTH * hours / 24), TIMELINE_HEIGHT) for hours in range(0, 25, 6)),
    )


def timeline_axis(now: datetime) -> SafeString:
    """The timeline's header: the local time every 6 hours from now."""
    labels = format_html_join(
        "",
        '<text class="periodic-chart-label" x="{}" y="12" text-anchor="{}">{}</text>',
        (
            (
                number(TIMELINE_WIDTH * hours / 24),
                "start" if hours == 0 else "end" if hours == 24 else "middle",
                display.local(now + timedelta(hours=hours)).strftime("%a %H:%M"),
            )
            for hours in range(0, 25, 6)
        ),
    )
    return format_html(
        '<svg class="periodic-timeline-axis" viewBox="0 0 {w} 16" width="{w}" height="16"'
        ' aria-hidden="true">{}</svg>',
        labels,
        w=TIMELINE_WIDTH,
    )
