"""The overview's charts of a ``Series``, as inline SVG: the start lag's p50 and p99 as
lines, the runs per minute as bars. Colours come from admin.css's classes, which take them
from the admin's CSS variables, so dark mode and the theme toggle apply; every chart has a
title and a description for screen readers, every point and bar a tooltip."""

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_periodic.admin import display
from django_periodic.admin.overview.sections import Series

WIDTH, HEIGHT = 560, 150
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 10, 22
PLOT_WIDTH, PLOT_HEIGHT = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def number(value: float) -> str:
    """A coordinate or a rate as SVG text: one decimal (format_html escapes its arguments
    to text before formatting them, so numbers are formatted first)."""
    return f"{value:.1f}"


def _x(series: Series, index: float) -> float:
    return LEFT + PLOT_WIDTH * index / len(series.starts)


def _y(value: float, top: float) -> float:
    return TOP + PLOT_HEIGHT * (1 - value / top) if top else TOP + PLOT_HEIGHT


def _clock(moment: datetime, unit: str) -> str:
    shown = display.local(moment)
    return shown.strftime("%H:%M") if unit == "minute" else shown.strftime("%a %H:%M")


def _frame(series: Series, chart_id: str, title: str, desc: str, top_label: str) -> SafeString:
    """The opening of a chart: its title and description, axes and labels."""
    last = len(series.starts) - 1
    ticks = format_html_join(
        "",
        '<text class="periodic-chart-label" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (number(_x(series, i + 0.5)), HEIGHT - 6, _clock(series.starts[i], series.unit))
            for i in (0, last // 2, last)
        ),
    )
    return format_html(
        '<svg class="periodic-chart" id="{id}" viewBox="0 0 {w} {h}" width="{w}" height="{h}"'
        ' role="img" aria-labelledby="{id}-title {id}-desc">'
        '<title id="{id}-title">{title}</title><desc id="{id}-desc">{desc}</desc>'
        '<line class="periodic-chart-axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>'
        '<line class="periodic-chart-axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
        '<text class="periodic-chart-label" x="{lx}" y="{ty}" text-anchor="end">{top}</text>'
        '<text class="periodic-chart-label" x="{lx}" y="{b}" text-anchor="end">0</text>{ticks}',
        id=chart_id,
        w=WIDTH,
        h=HEIGHT,
        title=title,
        desc=desc,
        l=LEFT,
        r=WIDTH - RIGHT,
        t=TOP,
        b=TOP + PLOT_HEIGHT,
        lx=LEFT - 4,
        ty=TOP + 8,
        top=top_label,
        ticks=ticks,
    )


def _segments(values: Sequence[float | None]) -> Iterator[list[tuple[int, float]]]:
    """Runs of consecutive known values: a line is broken where a bucket had none."""
    segment: list[tuple[int, float]] = []
    for index, value in enumerate(values):
        if value is None:
            if segment:
                yield segment
            segment = []
        else:
            segment.append((index, value))
    if segment:
        yield segment


def _seconds(values: Sequence[timedelta | None]) -> list[float | None]:
    return [None if value is None else max(value.total_seconds(), 0.0) for value in values]


def lag_chart(series: Series, chart_id: str, title: str) -> SafeString:
    """The start lag's p50 (solid) and p99 (dashed) per bucket, each point with a tooltip."""
    p50, p99 = _seconds(series.p50), _seconds(series.p99)
    known = [value for value in (*p50, *p99) if value is not None]
    top = max(known, default=0.0) or 1.0
    worst = max((v for v in p99 if v is not None), default=None)
    desc = (
        _("No first attempt started in this window.")
        if worst is None
        else _("Start lag of first attempts per bucket; the highest p99 is %(worst)s.")
        % {"worst": display.duration(timedelta(seconds=worst))}
    )
    parts = [_frame(series, chart_id, title, desc, display.duration(timedelta(seconds=top)))]
    for name, values in (("p50", p50), ("p99", p99)):
        for segment in _segments(values):
            points = " ".join(f"{_x(series, i + 0.5):.1f},{_y(v, top):.1f}" for i, v in segment)
            parts.append(
                format_html(
                    '<polyline class="periodic-chart-{}" points="{}" fill="none"/>', name, points
                )
            )
            parts.extend(
                format_html(
                    '<circle class="periodic-chart-{}" cx="{}" cy="{}" r="2.5">'
                    "<title>{} {}: {}</title></circle>",
                    name,
                    number(_x(series, i + 0.5)),
                    number(_y(v, top)),
                    _clock(series.starts[i], series.unit),
                    name,
                    display.duration(timedelta(seconds=v)),
                )
                for i, v in segment
            )
    parts.append(mark_safe("</svg>"))
    return format_html_join("", "{}", ((part,) for part in parts))


def runs_chart(series: Series, chart_id: str, title: str) -> SafeString:
    """Runs started per minute, a bar per bucket (an hour's bucket: its mean per minute)."""
    minutes = series.step / timedelta(minutes=1)
    rates = [runs / minutes for runs in series.runs]
    top = max(rates, default=0.0) or 1.0
    desc = _("%(total)d runs started; at most %(top).1f per minute.") % {
        "total": series.total,
        "top": max(rates, default=0.0),
    }
    bar = PLOT_WIDTH / len(series.starts)
    bars = format_html_join(
        "",
        '<rect class="periodic-chart-bar" x="{}" y="{}" width="{}" height="{}">'
        "<title>{}: {} runs ({}/min)</title></rect>",
        (
            (
                number(_x(series, i) + 0.5),
                number(_y(rate, top)),
                number(max(bar - 1, 0.5)),
                number(TOP + PLOT_HEIGHT - _y(rate, top)),
                _clock(series.starts[i], series.unit),
                series.runs[i],
                number(rate),
            )
            for i, rate in enumerate(rates)
        ),
    )
    frame = _frame(series, chart_id, title, desc, f"{top:.1f}/min")
    return format_html("{}{}</svg>", frame, bars)
