"""The jobs APScheduler runs in the comparison (importable by their textual references)."""

import os
import threading
from datetime import UTC, datetime

import psycopg

# One connection per executor thread, kept open between runs: what a user of APScheduler's
# thread pool would write (it has no connection handling of its own).
_local = threading.local()

INSERT = (
    "INSERT INTO tests_execution (schedule, plan_time, attempt, pid, executed_at) "
    "VALUES (%s, %s, %s, %s, %s)"
)


def noop() -> None:
    """Does nothing."""


def record(name: str) -> None:
    """The writing job: one INSERT in autocommit, the row ours' tests.jobs.record writes.
    APScheduler does not tell a job its scheduled time, so the row has the time it ran."""
    now = datetime.now(UTC)
    _connection().execute(INSERT, (name, now, 1, os.getpid(), now))


def _connection() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["BENCH_WRITE_URL"], autocommit=True)
    return conn
