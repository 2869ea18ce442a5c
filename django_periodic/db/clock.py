"""The one clock: the database's. Plan times, leases and retries are all read from it,
so scheduler processes on machines with skewed clocks still agree."""

import threading
import time
from collections import defaultdict, deque
from datetime import UTC, datetime

from django.db import connections
from django.utils import timezone

from django_periodic.db import features, postgresql


def wall_now() -> datetime:
    """This machine's clock, for defaults that need no agreement between processes."""
    return timezone.now()


def now(using: str = "default") -> datetime:
    """The database's current time, aware UTC.

    SQLite runs inside this process, so its clock is this machine's clock.
    """
    if not features(using).has_clock:
        return wall_now()
    connection = connections[using]
    value: datetime
    with connection.cursor() as cursor:
        cursor.execute(postgresql.CLOCK_SQL)
        (value,) = cursor.fetchone()
    _matches[using].monotonic_of(value, time.monotonic())  # one more bound, for free
    return value.astimezone(UTC)


# How long an observation of the database's clock counts: that clock may be stepped.
OBSERVATION_LIFETIME = 10.0


class Match:
    """This process's ``time.monotonic()`` matched to a database's clock, never too early.

    A statement's ``statement_timestamp()`` was read between its sending and its answer,
    so each answer bounds the offset between the two clocks from below; the best bound of
    the last ``OBSERVATION_LIFETIME`` seconds comes from the quickest answer. A run claimed
    ahead waits for its plan time by this match: by the claim's own answer alone, it
    would start as late as that statement took (milliseconds, under load).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (answered at, lower bound of the offset), the bounds decreasing: the best first.
        self._bounds: deque[tuple[float, float]] = deque()

    def monotonic_of(self, db_time: datetime, answered_at: float) -> float:
        """Note that a statement that read ``db_time`` was answered at ``answered_at``
        (``time.monotonic()``); return the latest ``time.monotonic()`` that ``db_time``
        may have been."""
        bound = db_time.timestamp() - answered_at
        with self._lock:
            bounds = self._bounds
            while bounds and bounds[-1][1] <= bound:
                bounds.pop()
            bounds.append((answered_at, bound))
            while answered_at - bounds[0][0] > OBSERVATION_LIFETIME:
                bounds.popleft()
            return db_time.timestamp() - bounds[0][1]


_matches: defaultdict[str, Match] = defaultdict(Match)


def monotonic_of(db_time: datetime, answered_at: float, using: str = "default") -> float:
    """The latest ``time.monotonic()`` that ``db_time`` (read on ``using`` by a statement
    answered at ``answered_at``) may have been: see ``Match``."""
    return _matches[using].monotonic_of(db_time, answered_at)
