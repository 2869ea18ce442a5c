"""A schedule's fires explained (``Schedule.explain()``) for people and machines: the window
asked for (``Window``: the last day, the last week, or since and until), and its accounts
as JSON or plain lines (``periodic_status --explain``) and as the admin's table rows.

Details hold stored text (errors, reasons, who): plain lines escape it for the terminal
(``escaping.py``); JSON escapes control characters itself.
"""

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from django_periodic.escaping import escaped
from django_periodic.models import FireAccount, FireStatus, Schedule
from django_periodic.timing import bounds

# The windows offered by name, the admin's chooser and the command's --since alike.
NAMED_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}
DEFAULT_WINDOW = "24h"
# A span back from now: "90m", "36h", "14d".
_AGO = re.compile(r"^(\d+)([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
# How an outcome stands out: the admin colours its word by this (admin.css), the plain
# lines do not need to.
TONES: dict[str, str] = {
    FireStatus.SUCCEEDED: "ok",
    FireStatus.FAILED: "bad",
    FireStatus.NO_RECORD: "bad",
    FireStatus.MIXED: "bad",
    FireStatus.RUNNING: "active",
    FireStatus.PENDING: "active",
    FireStatus.QUEUED: "active",
    FireStatus.RETRYING: "active",
    FireStatus.SKIPPED: "skipped",
    FireStatus.CANCELLED: "skipped",
    FireStatus.CLOSED: "skipped",
    FireStatus.PAUSED: "skipped",
    FireStatus.OVERRIDDEN: "skipped",
    FireStatus.MOVED: "skipped",
}


@dataclass(frozen=True)
class Window:
    """The fires to explain: ``[since, until)``."""

    since: datetime
    until: datetime


def moment(text: str, now: datetime) -> datetime:
    """A time given as ISO 8601 (UTC unless it says otherwise), or as a span back from
    ``now`` ("90m", "36h", "7d"). Raises ValueError for anything else; whether the time is
    one a window may have is ``Schedule.explain()``'s to say."""
    text = text.strip()
    if ago := _AGO.match(text):
        return _back(text, now, ago[1], _UNITS[ago[2]])
    return _parsed(text)


def _back(text: str, now: datetime, count: str, unit: str) -> datetime:
    """``count`` units before ``now``, or ValueError when no datetime is that far back (a
    count too long for int(), which reads at most 4300 digits, is further still)."""
    try:
        return now - timedelta(**{unit: int(count)})
    except (OverflowError, ValueError):
        earliest = bounds.show(bounds.EARLIEST)
        raise ValueError(
            f"{_shown(text)} is too far back: no window starts before {earliest}."
        ) from None


def _parsed(text: str) -> datetime:
    try:
        parsed = parse_datetime(text)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(
            f"Not a time: {_shown(text)} (ISO 8601, or a span back such as 36h or 7d)."
        )
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _shown(text: str) -> str:
    """What was given, for a message: quoted, and cut short if long."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def window(now: datetime, since: str = "", until: str = "", named: str = "") -> Window:
    """The window asked for: ``named`` (a key of ``NAMED_WINDOWS``) back from now, else
    ``since`` (default: the last 24 hours) up to ``until`` (default: now). Raises
    ValueError for a bad time, or a window that does not end after it starts."""
    if named:
        if named not in NAMED_WINDOWS:
            raise ValueError(f"Unknown window {named!r}: one of {', '.join(NAMED_WINDOWS)}.")
        return Window(now - NAMED_WINDOWS[named], now)
    start = moment(since, now) if since else now - NAMED_WINDOWS[DEFAULT_WINDOW]
    end = moment(until, now) if until else now
    if end <= start:
        raise ValueError("The window must end after it starts (until after since).")
    return Window(start, end)


def as_json(schedule: Schedule, asked: Window, accounts: list[FireAccount]) -> str:
    """Stable keys, ISO 8601 times (UTC)."""
    data: dict[str, Any] = {
        "schedule": schedule.name,
        "since": asked.since.isoformat(),
        "until": asked.until.isoformat(),
        "fires": [account.as_dict() for account in accounts],
    }
    return json.dumps(data, indent=2)


def as_plain(schedule: Schedule, asked: Window, accounts: list[FireAccount]) -> str:
    """A heading, then one line per fire: its time, outcome, code, run and details."""
    lines = [
        f"{escaped(schedule.name)}: {len(accounts)} fires from {_at(asked.since)} "
        f"to {_at(asked.until)}"
    ]
    for account in accounts:
        cells = [
            _at(account.plan_time),
            str(account.status),
            str(account.code),
            escaped(account.scope),
            f"run #{account.run_id}" if account.run_id else "",
            escaped(account.detail),
        ]
        lines.append("  " + "  ".join(cell for cell in cells if cell))
    return "\n".join(lines) + "\n"


def tone(account: FireAccount) -> str:
    """How its outcome stands out: ok, bad, active, skipped, or "" (no run, as expected)."""
    return TONES.get(account.status, "")


def _at(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"
