"""The range of every value a schedule row may hold, and of every time computed from one.

One home for these bounds: ``Schedule.clean()``, the admin form, the database's CHECK
constraints and the trigger math all read them from here, so no path can store, or compute,
a value that Python or PostgreSQL cannot represent. docs/semantics.md ("Ranges") lists them
with the reasons given here; a test checks that the two agree.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

# Stored and computed times stay within [EARLIEST, LATEST): far enough from Python's and
# PostgreSQL's limits that adding a bounded duration or shifting to any time zone is safe.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

# The cursor of a schedule stored without save() (bulk_create, raw SQL, a fixture): the
# database's default for next_fire_at. The planner plans such a schedule from its trigger
# instead of firing it at this time. Before EARLIEST, so never a real fire time.
UNPLANNED = datetime(1800, 1, 1, tzinfo=UTC)

# The shortest interval the database accepts. The working minimum is the MIN_INTERVAL
# setting (default 1 s), which clean() and every trigger built from a row enforce; a
# setting can change, so the CHECK holds this floor only. It stops intervals of
# microseconds, which fire faster than any scheduler can record (one recorded 141,626 runs
# in 16 s).
INTERVAL_FLOOR = timedelta(milliseconds=1)

# A century, the longest interval, misfire grace and retention: longer than anyone means
# (a grace of a century reads "never skip"), and EARLIEST minus or LATEST plus a century
# stays centuries away from the limits of Python's datetime (years 1 to 9999).
CENTURY = timedelta(days=36525)

_ZERO = timedelta(0)
_UNITS = (  # (unit, singular, plural), the largest first
    (timedelta(days=1), "day", "days"),
    (timedelta(hours=1), "hour", "hours"),
    (timedelta(minutes=1), "minute", "minutes"),
    (timedelta(seconds=1), "s", "s"),
    (timedelta(milliseconds=1), "ms", "ms"),
    (timedelta(microseconds=1), "µs", "µs"),
)

T = TypeVar("T", timedelta, int, datetime)


def show(value: timedelta | int | datetime) -> str:
    """A bound (or a value held against one) in words: "12 hours", "1 ms", "1900-01-01 00:00
    UTC", "1000"."""
    if isinstance(value, datetime):
        return f"{value.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    if isinstance(value, timedelta):
        if value == _ZERO:
            return "0 s"
        # In the largest unit that holds it exactly (the last, µs, always does).
        unit, singular, plural = next(u for u in _UNITS if value % u[0] == _ZERO)
        count = value // unit
        return f"{count} {singular if count == 1 else plural}"
    return str(value)


@dataclass(frozen=True)
class Range(Generic[T]):
    """The values a field may hold: from ``low`` to ``high``, each end included unless it is
    marked open. An empty field (None) is in every range; whether it may be empty is the
    field's own rule."""

    low: T
    high: T
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: T | None) -> bool:
        return value is None or self.error("value", value) is None

    def error(self, name: str, value: T | None) -> str | None:
        """Why ``value`` cannot be the field ``name``'s, or None if it can."""
        if value is None:
            return None
        if isinstance(value, datetime) and value.utcoffset() is None:
            return f"{name} must be timezone-aware."
        if value < self.low or (self.low_open and value == self.low):
            return f"{name} must {self._above_low()}."
        if value > self.high or (self.high_open and value == self.high):
            return f"{name} must {self._below_high()}."
        return None

    def describe(self) -> str:
        """The range in words, as docs/semantics.md lists it: "0 s (excluded) to 365 days"."""
        low = show(self.low) + (" (excluded)" if self.low_open else "")
        high = show(self.high) + (" (excluded)" if self.high_open else "")
        return f"{low} to {high}"

    def _above_low(self) -> str:
        if self.low == _ZERO:
            return "be positive" if self.low_open else "not be negative"
        return f"be {'more than' if self.low_open else 'at least'} {show(self.low)}"

    def _below_high(self) -> str:
        if not self.high_open:
            return f"be at most {show(self.high)}"
        before = "before" if isinstance(self.high, datetime) else "less than"
        return f"be {before} {show(self.high)}"


# Every time a schedule stores (a one-shot's time and the window of every kind).
TIMES = Range(EARLIEST, LATEST, high_open=True)

# The range of each bounded field of Schedule. Durations and counts have ceilings well past
# any real use, so that a typo (days for seconds, an extra zero) is an error, and so that
# no sum of a time and a duration leaves Python's or PostgreSQL's range.
SCHEDULE: dict[str, Range[Any]] = {
    # Also at least the MIN_INTERVAL setting (trigger_rows.trigger_field_errors).
    "interval": Range(INTERVAL_FLOOR, CENTURY),
    "run_at": TIMES,
    "start_at": TIMES,
    "end_at": TIMES,
    "paused_until": TIMES,
    # 0 makes every late fire a miss; a century never skips one.
    "misfire_grace": Range(_ZERO, CENTURY),
    # How long a downstream schedule waits for its upstreams from a plan time.
    "after_wait": Range(_ZERO, CENTURY, low_open=True),
    # The delay doubles after each retry, up to 2**30 times this, before it is capped at a
    # day: 12 hours * 2**30 is still a timedelta (a day * 2**30 is not), and a longer first
    # delay would be capped at once.
    "retry_backoff": Range(_ZERO, timedelta(hours=12)),
    # A run may take up to a year; no timeout at all is an empty field.
    "timeout": Range(_ZERO, timedelta(days=365), low_open=True),
    # How long the run of a process that died waits to be taken over (clean() also wants
    # twice HEARTBEAT_INTERVAL): a week is far past any use.
    "lease_timeout": Range(_ZERO, timedelta(days=7), low_open=True),
    "keep_runs_for": Range(_ZERO, CENTURY, low_open=True),
    "keep_failed_runs_for": Range(_ZERO, CENTURY, low_open=True),
    # A run's stagger (timing/stagger.py): a day spreads a daily job over all of it; 0 is none.
    "jitter": Range(_ZERO, timedelta(days=1)),
    # A thousand attempts: with the backoff capped at a day, years of retrying.
    "max_attempts": Range(1, 1000),
    # Runs waiting behind the active one (0: a fire while one is active is skipped), and
    # runs active at once: each holds a worker thread or a task, a thousand is plenty.
    "max_queued": Range(0, 1000),
    "max_concurrent": Range(1, 1000),
    # Finished runs kept per schedule by count.
    "keep_runs": Range(1, 1_000_000),
    # Alerts (models/alerting.py): a fire unsucceeded this long, or this many failures in
    # a row. A century is "never"; a thousand failures in a row is no alert worth having.
    "alert_after": Range(_ZERO, CENTURY, low_open=True),
    "alert_failures": Range(1, 1000),
    # A fire's deadline from its plan time (engine/runs/deadlines.py): a year, as a timeout.
    "finish_within": Range(_ZERO, timedelta(days=365), low_open=True),
    # Lifecycle (docs/policies.md): fires run before it stops; a billion is "no end" in
    # practice. Failed runs in a row before it pauses itself, as alert_failures.
    "max_runs": Range(1, 1_000_000_000),
    "pause_after_failures": Range(1, 1000),
}
