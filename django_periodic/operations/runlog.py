"""The run log: one structured line per run transition, on the ``django_periodic.runs``
logger, with the run's fields in ``extra`` (``FIELDS``) for JSON formatters to pick up.

It is a receiver of the signals (``signals.py``), connected only while the logger is
enabled for INFO (``follow()``): otherwise the signals have no listener and a transition
costs nothing. ``run_scheduler`` calls ``follow()`` again once ``--verbosity`` has set the
levels. See docs/logging.md.

The message escapes the stored text it quotes (``escaping.py``: a newline in a schedule's
name must not start a line of its own); ``extra`` keeps it as it is, for formatters that
write fields (JSON escapes it).
"""

import logging
from datetime import datetime, timedelta
from typing import Any

from django.dispatch import Signal

from django_periodic import choices, signals
from django_periodic.escaping import escaped

logger = logging.getLogger("django_periodic.runs")

# The keys each line adds to its LogRecord (stable: log pipelines filter on them).
FIELDS = (
    "event",  # planned, started, finished, retried, skipped, lease_lost, released,
    # schedule_disabled
    "schedule",  # the schedule's name
    "schedule_id",
    "run_id",
    "scope",
    "plan_time",  # ISO 8601
    "attempt",
    "status",
    "reason",
    "duration",  # seconds (finished only), else None
)

# Attempts that ended unfinished, the run going back to pending: logged as warnings.
UNFINISHED = (signals.lease_lost, signals.run_released)

EVENTS = {
    signals.run_planned: "planned",
    signals.run_started: "started",
    signals.run_finished: "finished",
    signals.run_retried: "retried",
    signals.run_skipped: "skipped",
    signals.lease_lost: "lease_lost",
    signals.run_released: "released",
}


def follow() -> bool:
    """Connect the run log to the signals if its logger is enabled for INFO, disconnect it
    otherwise; return whether it is connected."""
    enabled = logger.isEnabledFor(logging.INFO)
    for signal in EVENTS:
        _switch(signal, log_run, enabled)
    _switch(signals.schedule_disabled, log_disabled, enabled)
    return enabled


def _switch(signal: Signal, receiver: Any, on: bool) -> None:
    if on:
        signal.connect(receiver, dispatch_uid=f"django_periodic.runlog.{receiver.__name__}")
    else:
        signal.disconnect(receiver, dispatch_uid=f"django_periodic.runlog.{receiver.__name__}")


def log_run(signal: Signal, **kwargs: Any) -> None:
    """Log one run transition (a receiver of every run signal)."""
    event = EVENTS[signal]
    failed = kwargs["status"] in choices.WARNING_STATUSES or signal in UNFINISHED
    level = logging.WARNING if failed else logging.INFO
    if not logger.isEnabledFor(level):
        return
    duration: timedelta | None = kwargs.get("duration")
    extra = {
        "event": event,
        "schedule": kwargs["schedule"],
        "schedule_id": kwargs["schedule_id"],
        "run_id": kwargs["run_id"],
        "scope": kwargs["scope"],
        "plan_time": _iso(kwargs["plan_time"]),
        "attempt": kwargs["attempt"],
        "status": kwargs["status"],
        "reason": kwargs["reason"],
        "duration": None if duration is None else duration.total_seconds(),
    }
    because = f" ({escaped(extra['reason'])})" if extra["reason"] else ""
    logger.log(
        level,
        "Run %s of %s for %s %s: %s%s",
        extra["run_id"],
        escaped(extra["schedule"]),
        extra["plan_time"],
        event,
        extra["status"],
        because,
        extra=extra,
    )


def log_disabled(signal: Signal, **kwargs: Any) -> None:
    """Log a schedule the planner disabled (a receiver of ``schedule_disabled``)."""
    extra = {
        "event": "schedule_disabled",
        "schedule": kwargs["schedule"],
        "schedule_id": kwargs["schedule_id"],
        "run_id": None,
        "scope": "",
        "plan_time": None,
        "attempt": None,
        "status": "disabled",
        "reason": kwargs["error"],
        "duration": None,
    }
    name, error = escaped(kwargs["schedule"]), escaped(kwargs["error"])
    logger.warning("Schedule %s disabled: %s", name, error, extra=extra)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
