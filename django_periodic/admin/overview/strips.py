"""The overview's per-schedule pictures, as inline SVG: its last runs as a strip of cells
(colour: the outcome; height: the duration, relative to the strip's longest; each a link to
its run with a tooltip), and its next fires on a timeline of the next 24 hours."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from math import sqrt

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_periodic.admin import display
from django_periodic.admin.history import RunSummary
from django_periodic.admin.overview.charts import number
from django_periodic.admin.overview.sections import AHEAD, STRIP_RUNS, Timeline

CELL, GAP, STRIP_HEIGHT, STUB = 9, 2, 28, 6
TIMELINE_WIDTH, TIMELINE_HEIGHT = 480, 20


def strip(runs: Sequence[RunSummary], change_url: str, name: str) -> SafeString:
    """Cells for ``runs`` (newest first), drawn oldest to newest, the newest at the right.

    ``change_url`` is a run's change page with "0" as the id (one reverse per page).
    """
    prefix = change_url.removesuffix("0/change/")
    longest = max((run.duration for run in runs if run.duration), default=None)
    width = STRIP_RUNS * (CELL + GAP)
    first = width - len(runs) * (CELL + GAP)
    cells = format_html_join(
        "",
        "{}",
        (
            (_cell(run, first + i * (CELL + GAP), longest, prefix),)
            for i, run in enumerate(reversed(runs))
        ),
    )
    label = _("Last %(n)d runs of %(name)s") % {"n": len(runs), "name": name}
    return format_html(
        '<svg class="periodic-runs" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img"'
        ' aria-label="{}"><title>{}</title>{}</svg>',
        label,
        label,
        cells,
        w=width,
        h=STRIP_HEIGHT,
    )


def _cell(run: RunSummary, x: int, longest: timedelta | None, prefix: str) -> SafeString:
    height = _height(run.duration, longest)
    return format_html(
        '<a href="{}{}/change/"><rect class="periodic-cell periodic-cell-{}" x="{}" y="{}"'
        ' width="{}" height="{}"><title>{}</title></rect></a>',
        prefix,
        run.pk,
        run.status,
        x,
        number(STRIP_HEIGHT - height),
        CELL,
        number(height),
        _title(run),
    )


def _height(duration: timedelta | None, longest: timedelta | None) -> float:
    """A stub without a duration; else up to the full height, by the square root of its
    share of the longest (a 1 s run beside a 100 s one stays visible)."""
    if not duration or not longest:
        return STUB
    return STUB + (STRIP_HEIGHT - STUB) * sqrt(max(duration / longest, 0.0))


def _title(run: RunSummary) -> str:
    parts = [
        f"#{run.pk}",
        display.status_label(run.status),
        display.local(run.plan_time).strftime("%Y-%m-%d %H:%M:%S"),
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
    ticks = format_html_join(
        "",
        '<rect class="periodic-fire" x="{}" y="3" width="2" height="{}"><title>{}</title></rect>',
        ((number(_x(fire, now)), TIMELINE_HEIGHT - 6, _fire_title(fire)) for fire in line.fires),
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


def _fire_title(fire: datetime) -> str:
    return display.local(fire).strftime("%a %Y-%m-%d %H:%M:%S")


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
