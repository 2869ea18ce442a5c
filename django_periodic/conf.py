"""The app's settings: one optional dict, ``settings.DJANGO_PERIODIC``, read lazily."""

import enum
import math
import re
import sys
from dataclasses import dataclass, fields
from datetime import timedelta
from functools import cache
from numbers import Real
from typing import Any, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_periodic.timing import bounds

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
    # Mixed releases (engine/fleet.py): how long no live process may have a schedule's job
    # before the planners disable the schedule (a rolling deploy that adds a job takes
    # less than this to start a process that has it).
    UNKNOWN_JOB_GRACE: timedelta = timedelta(minutes=10)
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
    # Each schedule's newest versions kept (docs/versions.md); None: every version.
    KEEP_VERSIONS: int | None = 100
    PRUNE_INTERVAL: timedelta = timedelta(hours=1)
    PRUNE_BATCH_SIZE: int = 1000
    # Alerts (engine/planning/attention.py): how often a scheduler judges which schedules need
    # attention (at least ALERT_INTERVAL_FLOOR, check E007), and whether each change is
    # also mailed to the ADMINS. Metrics: a per-schedule series of whether each schedule
    # with alerts needs attention, off by default (one series per schedule).
    ALERT_INTERVAL: timedelta = timedelta(minutes=1)
    ALERT_MAIL_ADMINS: bool = False
    METRICS_SCHEDULE_LABELS: bool = False
    # Outside monitoring (docs/monitoring.md), each off until switched on: Sentry Crons
    # check-ins per run (contrib/sentry.py, needs sentry-sdk), each schedule's ping URL
    # (operations/pings.py) with its request timeout, and OpenTelemetry spans
    # (contrib/opentelemetry.py, needs opentelemetry-api).
    SENTRY_CRONS: bool = False
    PINGS: bool = False
    PING_TIMEOUT: timedelta = timedelta(seconds=10)
    # The hosts a ping may go to (models/validation.py), as ALLOWED_HOSTS names them;
    # None or empty: any.
    PING_HOSTS: tuple[str, ...] | None = None
    OPENTELEMETRY: bool = False


DURATION_KEYS = frozenset(
    f.name for f in fields(PeriodicSettings) if f.type in (timedelta, timedelta | None)
)
INTEGER_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type in (int, int | None))
BOOLEAN_KEYS = frozenset(f.name for f in fields(PeriodicSettings) if f.type is bool)
# The shortest ALERT_INTERVAL: judging every schedule is one query, but not one per tick.
ALERT_INTERVAL_FLOOR = timedelta(seconds=1)
# Text keys, and those of them that may be None.
STRING_KEYS = frozenset({"TASKS_BACKEND", "TASKS_QUEUE", "WAKEUP_DATABASE"})
# Lists of host names, each as in Django's ALLOWED_HOSTS.
HOST_LIST_KEYS = frozenset({"PING_HOSTS"})
MAY_BE_NONE = frozenset(
    {"TASKS_BACKEND", "WAKEUP_DATABASE", "KEEP_RUNS", "KEEP_RUNS_FOR", "KEEP_FAILED_RUNS_FOR"}
    | {"KEEP_VERSIONS", "PING_HOSTS"}
)
# Keys for which 0 is a meaningful value (it turns the feature off).
MAY_BE_ZERO = frozenset({"PLAN_AHEAD", "UNKNOWN_JOB_GRACE"})

_ZERO = timedelta(0)
_DAY = timedelta(days=1)
_WEEK = timedelta(days=7)
# The range of every number and duration key (docs/settings.md lists them; a test checks
# that the two agree). Ceilings are far past any real use, so that a typo (an extra zero,
# days for seconds) is an error, and low enough that the loop can add any of them, or a few
# times one, to the database's clock: a duration of 10**13 s is no datetime's.
RANGES: dict[str, bounds.Range[Any]] = {
    "WORKERS": bounds.Range(1, 1000),
    "PREFETCH": bounds.Range(1, 10_000),
    "PLAN_AHEAD": bounds.Range(_ZERO, timedelta(hours=1)),
    "POLL_INTERVAL": bounds.Range(_ZERO, _DAY, low_open=True),
    "HEARTBEAT_INTERVAL": bounds.Range(_ZERO, _DAY, low_open=True),
    "SWEEP_INTERVAL": bounds.Range(_ZERO, _DAY, low_open=True),
    "IDLE_INTERVAL": bounds.Range(_ZERO, _DAY, low_open=True),
    "SHUTDOWN_GRACE": bounds.Range(_ZERO, _DAY, low_open=True),
    "TIMEOUT_GRACE": bounds.Range(_ZERO, _DAY, low_open=True),
    "PLAN_BATCH_SIZE": bounds.Range(1, 1_000_000),
    "CATCHUP_LIMIT": bounds.Range(1, 100_000),
    # Up to the run's interruption count's column: past any real use, it means "no limit"
    # (the crash tests set 1,000,000).
    "STALE_REENTRY_LIMIT": bounds.Range(1, 2**31 - 1),
    "PLANNING_FAILURE_LIMIT": bounds.Range(1, 1000),
    "UNKNOWN_JOB_GRACE": bounds.Range(_ZERO, _WEEK),
    # What the database accepts (its CHECK holds the floor; system check E006).
    "MIN_INTERVAL": bounds.SCHEDULE["interval"],
    "RESULT_MAX_BYTES": bounds.Range(1, 64 * 2**20),
    "ERROR_MAX_CHARS": bounds.Range(1, 16 * 2**20),
    "TASKS_PICKUP_TIMEOUT": bounds.Range(_ZERO, _WEEK, low_open=True),
    # As a schedule's own retention fields.
    "KEEP_RUNS": bounds.SCHEDULE["keep_runs"],
    "KEEP_RUNS_FOR": bounds.SCHEDULE["keep_runs_for"],
    "KEEP_FAILED_RUNS_FOR": bounds.SCHEDULE["keep_failed_runs_for"],
    "KEEP_VERSIONS": bounds.Range(1, 1_000_000),
    "PRUNE_INTERVAL": bounds.Range(_ZERO, _WEEK, low_open=True),
    "PRUNE_BATCH_SIZE": bounds.Range(1, 1_000_000),
    "ALERT_INTERVAL": bounds.Range(ALERT_INTERVAL_FLOOR, _DAY),
    "PING_TIMEOUT": bounds.Range(_ZERO, timedelta(minutes=5), low_open=True),
}
# Why a range is what it is, where the message should say.
_RANGE_NOTES = {"MIN_INTERVAL": " (the intervals the database accepts)"}


class Refusal(enum.Enum):
    """Which rule a refused value breaks (each is its own system check, checks.py)."""

    UNKNOWN = "unknown"  # no such key
    WRONG = "wrong"  # wrong type, or not positive (negative where 0 is allowed)
    NOT_FINITE = "not finite"  # infinity or NaN
    BELOW = "below"  # under its range's floor
    ABOVE = "above"  # past its range's ceiling


class InvalidSetting(ValueError):
    """A value that cannot be the key's: ``refusal`` says which rule, the message why."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def parse(key: str, value: object) -> Any:
    """``value`` as key ``key`` of the settings (a duration as a timedelta), or
    InvalidSetting. Never anything else: the checks call it on any value at all."""
    if value is None and key in MAY_BE_NONE:
        return None
    if key in DURATION_KEYS:
        return _duration(key, value)
    if key in INTEGER_KEYS:
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidSetting(Refusal.WRONG, "must be an integer.")
        if value <= 0:
            raise InvalidSetting(Refusal.WRONG, "must be positive.")
        return _in_range(key, value)
    if key in STRING_KEYS:
        if not isinstance(value, str) or not value:
            raise InvalidSetting(Refusal.WRONG, "must be a non-empty string.")
        return value
    if key in BOOLEAN_KEYS:
        if not isinstance(value, bool):
            raise InvalidSetting(Refusal.WRONG, "must be True or False.")
        return value
    if key in HOST_LIST_KEYS:
        return _hosts(value)
    known = ", ".join(
        sorted(DURATION_KEYS | INTEGER_KEYS | STRING_KEYS | BOOLEAN_KEYS | HOST_LIST_KEYS)
    )
    raise InvalidSetting(Refusal.UNKNOWN, f"is not a known setting. Known settings: {known}.")


def _duration(key: str, value: object) -> timedelta:
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, Real) and not isinstance(value, bool):
        seconds = _float(value)
        if not math.isfinite(seconds):
            raise InvalidSetting(
                Refusal.NOT_FINITE, f"must be a finite number of seconds, not {seconds}."
            )
        # Before timedelta(), which cannot hold them all.
        if seconds < 0:
            duration = -_DAY  # refused as negative below
        elif seconds > RANGES[key].high.total_seconds():
            raise InvalidSetting(Refusal.ABOVE, _out_of_range(key, f"{seconds:g} s"))
        else:
            duration = timedelta(seconds=seconds)
    else:
        raise InvalidSetting(Refusal.WRONG, "must be a number of seconds or a timedelta.")
    # After rounding to microseconds: 1e-9 s is 0.
    if key in MAY_BE_ZERO and duration < _ZERO:
        raise InvalidSetting(Refusal.WRONG, "must not be negative.")
    if key not in MAY_BE_ZERO and duration <= _ZERO:
        raise InvalidSetting(Refusal.WRONG, "must be positive.")
    _in_range(key, duration)
    return duration


# A host name (a leading dot: and its subdomains), an IPv4 address, or an IPv6 one in
# brackets; "*" for any, as in ALLOWED_HOSTS.
_HOST_PATTERN = re.compile(r"\*|\.?[\w-]+(\.[\w-]+)*|\[[0-9a-fA-F:.]+\]")


def _hosts(value: object) -> tuple[str, ...]:
    """A list of host names as ALLOWED_HOSTS has them ("hc-ping.com", ".example.com" for it
    and its subdomains), lowercased; a URL, a port or a lone string is refused."""
    if not isinstance(value, list | tuple):  # a lone string too
        raise InvalidSetting(
            Refusal.WRONG, 'must be a list of host names, e.g. ["hc-ping.com"], or None.'
        )
    for number, host in enumerate(value, 1):
        # Not repeated in the message: a ping URL pasted here holds its check's key.
        if not isinstance(host, str) or not _HOST_PATTERN.fullmatch(host):
            raise InvalidSetting(
                Refusal.WRONG,
                f"must hold host names only, such as hc-ping.com or .example.com: entry "
                f"{number} is not one (no scheme, port, path or user).",
            )
    return tuple(host.lower() for host in value)


def _float(value: Real) -> float:
    try:
        return float(value)
    except OverflowError:  # an int too large for a float: past every ceiling
        # (Real declares no comparison; every Real has one.)
        positive = cast(float, value) > 0
        return sys.float_info.max if positive else -sys.float_info.max


def _in_range(key: str, value: Any) -> Any:
    valid = RANGES[key]
    if value < valid.low or (valid.low_open and value == valid.low):
        raise InvalidSetting(Refusal.BELOW, _out_of_range(key, bounds.show(value)))
    if value > valid.high or (valid.high_open and value == valid.high):
        shown = _large_int(value) if isinstance(value, int) else bounds.show(value)
        raise InvalidSetting(Refusal.ABOVE, _out_of_range(key, shown))
    return value


def _large_int(value: int) -> str:
    """An integer past a range, shortly: past a float's range, by its number of bits."""
    try:
        return f"{value:.3g}"
    except OverflowError:
        return f"an integer of {value.bit_length()} bits"


def _out_of_range(key: str, shown: str) -> str:
    return f"must be from {RANGES[key].describe()}{_RANGE_NOTES.get(key, '')}, not {shown}."


@cache
def get_settings() -> PeriodicSettings:
    """The effective settings. Call it where the value is used, so tests can override them
    (``override_settings`` and pytest-django's ``settings`` send ``setting_changed``, which
    forgets them). Kept between calls: a worker reads them for every run.

    A value the system checks refuse (checks.py) is read as the key's default: the checks
    report it, and nothing that reads the settings (the checks among them) fails on it."""
    configured = getattr(settings, SETTING_NAME, None)
    values: dict[str, Any] = {}
    for key, value in configured.items() if isinstance(configured, dict) else ():
        try:
            values[key] = parse(key, value)
        except InvalidSetting:
            continue
    return PeriodicSettings(**values)


@receiver(setting_changed)
def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        get_settings.cache_clear()


def tasks_backend_for(schedule_backend: str) -> str:
    """The TASKS alias whose workers execute a schedule's runs: the schedule's own, else the
    ``TASKS_BACKEND`` setting; "" for run_scheduler's own workers."""
    return schedule_backend or get_settings().TASKS_BACKEND or ""
