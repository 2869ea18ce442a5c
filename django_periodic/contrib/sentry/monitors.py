"""A schedule's Sentry Crons monitor: its slug, from the schedule's name, and its
``monitor_config``, from the schedule's trigger, time zone, misfire grace, jitter, timeout
and alerts. Sentry creates or updates the monitor from the config a check-in carries.

What Sentry cannot express (an RRULE, a one-shot ``run_at``, an interval that is no whole
number of minutes, fires closed by calendars) gets no config: its check-ins still go to the
monitor's slug, and the monitor is made by hand in Sentry. docs/sentry.md.
"""

import hashlib
import math
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils.text import slugify

from django_periodic.models import Schedule
from django_periodic.timing.cron_fields import MACROS

# Sentry's ingest (relay-monitors) keeps the first 50 characters of a slug.
SLUG_LENGTH = 50
# The name's hash that keeps apart two names with one slug (8 hex digits: 32 bits).
HASH_LENGTH = 8
# Sentry's ceiling for a check-in margin and a maximum runtime, in minutes (28 days).
MINUTES_CEILING = 40_320
# Sentry's ceiling for a failure (or recovery) threshold, in check-ins.
THRESHOLD_CEILING = 720
# The units an interval monitor may have that a timedelta can express, largest first.
INTERVAL_UNITS = (("week", 7 * 86_400), ("day", 86_400), ("hour", 3_600), ("minute", 60))
# The fields a monitor's config is made of (read in one query, ``configs()``).
FIELDS = ("cron", "interval", "timezone", "misfire_grace", "jitter", "timeout", "alert_failures")

MonitorConfig = dict[str, Any]


def monitor_slug(name: str) -> str:
    """The slug of the monitor of the schedule named ``name``.

    A name that is a slug already (lowercase letters, digits, ``-`` and ``_``, at most 50)
    is its own slug. Any other is slugified (``.``, ``/``, spaces become ``-``), cut to fit,
    and ends with a hash of the whole name, so that two names never share a monitor.
    """
    base = slugify(re.sub(r"[^\w-]+", " ", name))
    if base == name and len(base) <= SLUG_LENGTH:
        return base
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_LENGTH]
    kept = base[: SLUG_LENGTH - HASH_LENGTH - 1].strip("-_")
    return f"{kept}-{digest}" if kept else f"schedule-{digest}"


def monitor_config(schedule: Schedule) -> MonitorConfig | None:
    """The ``monitor_config`` its check-ins carry for a saved schedule, as stored; None if
    Sentry cannot express its fires."""
    return configs([schedule.pk], schedule._state.db or "default").get(schedule.pk)


def config_of(fields: dict[str, Any], *, closed_days: bool = False) -> MonitorConfig | None:
    """The ``monitor_config`` of a schedule with these ``FIELDS``; None if Sentry cannot
    express its fires (``closed_days``: calendars close some of them)."""
    schedule = None if closed_days else _schedule(fields)
    if schedule is None:
        return None
    late = fields["misfire_grace"] + (fields["jitter"] or timedelta(0))
    config: MonitorConfig = {
        "schedule": schedule,
        "timezone": fields["timezone"],
        "checkin_margin": minutes(late),
    }
    if fields["timeout"] is not None:
        config["max_runtime"] = minutes(fields["timeout"])
    if fields["alert_failures"] is not None:
        config["failure_issue_threshold"] = min(fields["alert_failures"], THRESHOLD_CEILING)
        # A schedule stops needing attention at its first success (models/alerting.py).
        config["recovery_threshold"] = 1
    return config


def _schedule(fields: dict[str, Any]) -> dict[str, Any] | None:
    cron = " ".join(fields["cron"].split())
    if cron:
        return {"type": "crontab", "value": MACROS.get(cron.lower(), cron)}
    interval = fields["interval"]
    if interval is not None:
        return interval_schedule(interval)
    return None  # an RRULE, or a one-shot run_at


def interval_schedule(interval: timedelta) -> dict[str, Any] | None:
    """An interval in the largest unit that divides it; None if no unit does (under a
    minute, or not a whole number of minutes)."""
    seconds = interval.total_seconds()
    for unit, length in INTERVAL_UNITS:
        if seconds >= length and seconds % length == 0:
            return {"type": "interval", "value": int(seconds // length), "unit": unit}
    return None


def minutes(duration: timedelta) -> int:
    """A duration in whole minutes, rounded up, within what Sentry accepts (1 to 28 days)."""
    return max(1, min(math.ceil(duration.total_seconds() / 60), MINUTES_CEILING))


def configs(schedule_ids: Iterable[int], using: str) -> dict[int, MonitorConfig | None]:
    """The monitor configs of these schedules, by id, in one query (a schedule deleted
    since is left out)."""
    closed = Schedule.calendars.through.objects.filter(schedule_id=OuterRef("pk"))
    rows = (
        Schedule.objects.using(using)
        .filter(pk__in=list(schedule_ids))
        .annotate(closed_days=Exists(closed))
        .values("pk", "closed_days", *FIELDS)
    )
    found = {}
    for row in rows:
        pk, closed_days = row.pop("pk"), row.pop("closed_days")
        found[pk] = config_of(row, closed_days=closed_days)
    return found
