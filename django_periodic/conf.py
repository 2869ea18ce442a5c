"""The app's settings: one optional dict, ``settings.DJANGO_PERIODIC``, read lazily."""

from dataclasses import dataclass, fields
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

SETTING_NAME = "DJANGO_PERIODIC"


@dataclass(frozen=True)
class PeriodicSettings:
    """Every key of ``DJANGO_PERIODIC`` with its default. Durations accept seconds or timedelta."""

    WORKERS: int = 4
    PREFETCH: int = 32
    PLAN_AHEAD: timedelta = timedelta(seconds=1)
    POLL_INTERVAL: timedelta = timedelta(seconds=5)
    HEARTBEAT_INTERVAL: timedelta = timedelta(seconds=10)
    SWEEP_INTERVAL: timedelta = timedelta(seconds=10)
    IDLE_INTERVAL: timedelta = timedelta(seconds=120)
    SHUTDOWN_GRACE: timedelta = timedelta(seconds=30)
    TIMEOUT_GRACE: timedelta = timedelta(seconds=10)
    PLAN_BATCH_SIZE: int = 5000
    CATCHUP_LIMIT: int = 100
    STALE_REENTRY_LIMIT: int = 3
    PLANNING_FAILURE_LIMIT: int = 3
    # The shortest interval a schedule may have: clean() refuses shorter ones, and the
    # planner refuses (and in the end disables) a shorter one stored anyway. At least
    # bounds.INTERVAL_FLOOR, what the database accepts (system check E006).
    MIN_INTERVAL: timedelta = timedelta(seconds=1)
    RESULT_MAX_BYTES: int = 64 * 1024
    ERROR_MAX_CHARS: int = 16 * 1024
    # Hand-off: a TASKS alias whose workers execute runs (None: run_scheduler's threads),
    # the queue their tasks go to, and how long a task may wait unclaimed before it is
    # presumed lost and enqueued again.
    TASKS_BACKEND: str | None = None
    TASKS_QUEUE: str = "default"
    TASKS_PICKUP_TIMEOUT: timedelta = timedelta(minutes=5)
    # The DATABASES alias of a direct connection (no transaction pooler) to the schedulers'
    # database, for the wake-up listener and the process's session lock (pooling.py).
    WAKEUP_DATABASE: str | None = None
    # Retention (retention.py): finished runs kept by count and age, failed ones for longer
    # (None: no such rule; no rule at all keeps everything), and how often and in what
    # batches run_scheduler deletes the others.
    KEEP_RUNS: int | None = None
    KEEP_RUNS_FOR: timedelta | None = None
    KEEP_FAILED_RUNS_FOR: timedelta | None = None
    PRUNE_INTERVAL: timedelta = timedelta(hours=1)
    PRUNE_BATCH_SIZE: int = 1000
    # Alerts (engine/attention.py): how often a scheduler judges which schedules need
    # attention (at least ALERT_INTERVAL_FLOOR, check E007), and whether each change is
    # also mailed to the ADMINS. Metrics: a per-schedule series of whether each schedule
    # with alerts needs attention, off by default (one series per schedule).
    ALERT_INTERVAL: timedelta = timedelta(minutes=1)
    ALERT_MAIL_ADMINS: bool = False
    METRICS_SCHEDULE_LABELS: bool = False


DURATION_KEYS = frozenset(
    f.name for f in fields(PeriodicSettings) if f.type in (timedelta, timedelta | None)
)
INTEGER_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type in (int, int | None))
BOOLEAN_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type is bool)
# The shortest ALERT_INTERVAL: judging every schedule is one query, but not one per tick.
ALERT_INTERVAL_FLOOR = timedelta(seconds=1)
# Text keys, and those of them that may be None.
STRING_KEYS = frozenset({"TASKS_BACKEND", "TASKS_QUEUE", "WAKEUP_DATABASE"})
MAY_BE_NONE = frozenset(
    {"TASKS_BACKEND", "WAKEUP_DATABASE", "KEEP_RUNS", "KEEP_RUNS_FOR", "KEEP_FAILED_RUNS_FOR"}
)
# Keys for which 0 is a meaningful value (it turns the feature off).
MAY_BE_ZERO = frozenset({"PLAN_AHEAD"})


def _as_timedelta(value: Any) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=value)


@cache
def get_settings() -> PeriodicSettings:
    """The effective settings. Call it where the value is used, so tests can override them
    (``override_settings`` and pytest-django's ``settings`` send ``setting_changed``, which
    forgets them). Kept between calls: a worker reads them for every run."""
    configured = getattr(settings, SETTING_NAME, None) or {}
    values: dict[str, Any] = {}
    for key, value in configured.items():
        if key in DURATION_KEYS:
            values[key] = _as_timedelta(value)
        elif key in INTEGER_KEYS or key in STRING_KEYS or key in BOOLEAN_KEYS:
            values[key] = value
    return PeriodicSettings(**values)


@receiver(setting_changed)
def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        get_settings.cache_clear()


def tasks_backend_for(schedule_backend: str) -> str:
    """The TASKS alias whose workers execute a schedule's runs: the schedule's own, else the
    ``TASKS_BACKEND`` setting; "" for run_scheduler's own workers."""
    return schedule_backend or get_settings().TASKS_BACKEND or ""
