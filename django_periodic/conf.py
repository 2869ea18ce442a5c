"""The app's settings: one optional dict, ``settings.DJANGO_PERIODIC``, read lazily."""

from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from django.conf import settings

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
    RESULT_MAX_BYTES: int = 64 * 1024
    ERROR_MAX_CHARS: int = 16 * 1024


DURATION_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type is timedelta)
INTEGER_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type is int)
# Keys for which 0 is a meaningful value (it turns the feature off).
MAY_BE_ZERO = frozenset({"PLAN_AHEAD"})


def _as_timedelta(value: Any) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def get_settings() -> PeriodicSettings:
    """The effective settings. Call it where the value is used, so tests can override them."""
    configured = getattr(settings, SETTING_NAME, None) or {}
    values: dict[str, Any] = {}
    for key, value in configured.items():
        if key in DURATION_KEYS:
            values[key] = _as_timedelta(value)
        elif key in INTEGER_KEYS:
            values[key] = value
    return PeriodicSettings(**values)
