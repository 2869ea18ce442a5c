"""The status report (:func:`django_periodic.operations.health.gather`) as text: plain lines, rich
tables (when the optional ``rich`` package is installed), or JSON for machines.

Names, errors, pause reasons and scopes are stored text: every cell is escaped for the
terminal (``escaping.py``), and for rich its markup too, so that no cell can move the
cursor, rewrite a line or style the table. JSON escapes control characters itself.
"""

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from importlib.util import find_spec
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_periodic.escaping import escaped
from django_periodic.operations import health

RICH_INSTALLED = find_spec("rich") is not None


@dataclass(frozen=True)
class Section:
    """One titled table of the report; cells are already text."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    note: str = ""


def as_json(report: health.Report) -> str:
    """Stable keys, ISO 8601 times (UTC), durations in seconds."""
    data: dict[str, Any] = {
        "now": report.now,
        "ok": not report.problems,
        "problems": [asdict(problem) for problem in report.problems],
        "schedulers": report.schedulers,
        "runs_by_status": report.runs_by_status,
        "due_soon": report.due_soon,
        "running": report.running,
        "expired_leases": report.expired_leases,
        "schedule_errors": report.schedule_errors,
        "needing_attention": report.needing_attention,
        "paused": report.paused,
        "failures": {
            "window_seconds": health.FAILURES_WINDOW.total_seconds(),
            "count": report.failures,
            "latest": report.latest_failures,
            "by_scope": report.failures_by_scope,
            "more_scopes": report.more_failing_scopes,
        },
        "lag": {
            "window_seconds": health.LAG_WINDOW.total_seconds(),
            "runs": report.lag.runs,
            "p50_seconds": _seconds_or_none(report.lag.p50),
            "p99_seconds": _seconds_or_none(report.lag.p99),
        },
    }
    return json.dumps(data, cls=DjangoJSONEncoder, indent=2)


def as_plain(report: health.Report, heading: Callable[[str], str] = str) -> str:
    """Each section's title (styled by ``heading``), then one indented line per row."""
    lines = []
    for section in sections(report):
        lines.append(heading(escaped(section.title)))
        lines.extend(
            "  " + "  ".join(escaped(cell) for cell in row if cell) for row in section.rows
        )
        if section.note:
            lines.append(f"  {escaped(section.note)}")
    return "\n".join(lines) + "\n"


def as_rich(report: health.Report) -> str:
    """Each section as a rich table, with terminal colours; needs ``rich``."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def cell(text: str) -> str:
        return escape(escaped(text))

    buffer = io.StringIO()
    width = shutil.get_terminal_size().columns
    # Nor ":name:" emoji codes in stored text.
    console = Console(file=buffer, force_terminal=True, width=width, highlight=False, emoji=False)
    for section in sections(report):
        columns = [cell(column) for column in section.columns]
        table = Table(*columns, title=cell(section.title), title_justify="left")
        for row in section.rows:
            table.add_row(*[cell(text) for text in row])
        if section.note:
            table.caption = cell(section.note)
        console.print(table)
    return buffer.getvalue()


def sections(report: health.Report) -> list[Section]:
    """The report's tables, in the order an operator reads them."""
    now = report.now
    scopes_note = ""
    if report.more_failing_scopes:
        scopes_note = f"... and {report.more_failing_scopes} more scopes with failures"
    found = [
        Section(
            "Schedulers",
            ("process", "state", "last heartbeat"),
            [
                (p["name"], "alive" if p["alive"] else "STALE", f"{_ago(now, p['heartbeat_at'])}")
                for p in report.schedulers
            ],
        ),
        Section(
            "Runs by status",
            ("status", "runs"),
            [(f"{status:<10}", str(n)) for status, n in report.runs_by_status.items()],
        ),
        Section(
            "Due in the next hour",
            ("schedule", "next fire"),
            [(s["name"], _when(now, s["next_fire_at"])) for s in report.due_soon],
        ),
        Section(
            "Running",
            ("run", "job", "holder", "started", "lease expires"),
            [
                (
                    f"run {r['run_id']}",
                    _scoped(r["job"], r["scope"]),
                    f"held by {r['holder']}",
                    f"started {_when(now, r['started_at'])}",
                    f"lease expires {_when(now, r['expires_at'])}",
                )
                for r in report.running
            ],
        ),
        Section(
            "Expired leases (holder stopped heartbeating)",
            ("run", "job", "holder", "expired"),
            [
                (
                    f"run {lease['run_id']}",
                    f"({lease['job']})",
                    f"held by {lease['holder']}",
                    f"expired {_when(now, lease['expires_at'])}",
                )
                for lease in report.expired_leases
            ],
        ),
        Section(
            "Schedules with errors",
            ("schedule", "state", "failed ticks", "last error"),
            [
                (
                    s["name"],
                    "enabled" if s["enabled"] else "DISABLED",
                    f"{s['planning_failures']} failed ticks",
                    s["last_error"],
                )
                for s in report.schedule_errors
            ],
        ),
        Section(
            "Needing attention (alerts)",
            ("schedule", "since", "why"),
            [
                (s["name"], f"since {_at(s['since'])}", s["message"])
                for s in report.needing_attention
            ],
        ),
        Section(
            "Paused",
            ("schedule", "until", "by", "why"),
            [
                (s["name"], f"until {_at(s['paused_until'])}", s["paused_by"], s["pause_reason"])
                for s in report.paused
            ],
        ),
        Section(
            f"Failures in the last 24 h: {report.failures}",
            ("job", "plan time", "error"),
            [
                (_scoped(r["job"], r["scope"]), f"@ {_at(r['plan_time'])}", r["error_code"])
                for r in report.latest_failures
            ],
        ),
        Section(
            "Failures by scope",
            ("schedule [scope]", "failed"),
            [
                (f"{r['schedule_name']} [{r['scope']}]", f"{r['failed']} failed")
                for r in report.failures_by_scope
            ],
            scopes_note,
        ),
        Section(
            "Fire lag (first attempts started in the last hour)",
            ("runs", "p50", "p99"),
            [
                (
                    f"{report.lag.runs} runs",
                    f"p50 {_duration(report.lag.p50)}",
                    f"p99 {_duration(report.lag.p99)}",
                )
            ],
        ),
    ]
    # A section with nothing to say is left out, but for the schedulers (none is news).
    return [s for s in found if s.rows or s.title == "Schedulers"]


def _scoped(job: str, scope: str) -> str:
    return f"{job} [{scope}]" if scope else job


def _at(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment else "-"


def _when(now: datetime, moment: datetime | None) -> str:
    """An absolute UTC time and how far it is from ``now``."""
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    relative = f"in {seconds:.0f} s" if seconds >= 0 else f"{-seconds:.0f} s ago"
    return f"{_at(moment)} ({relative})"


def _ago(now: datetime, moment: datetime) -> str:
    return f"last heartbeat {(now - moment).total_seconds():.0f} s ago"


def _duration(duration: timedelta | None) -> str:
    return "-" if duration is None else f"{duration.total_seconds():.3f} s"


def _seconds_or_none(duration: timedelta | None) -> float | None:
    return None if duration is None else duration.total_seconds()
