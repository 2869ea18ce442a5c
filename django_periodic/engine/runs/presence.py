"""Knowing within a second that a scheduler process died: a session lock per process.

On PostgreSQL each ``run_scheduler`` process holds a session-level advisory lock, keyed by
its ``SchedulerProcess`` id (``db/postgresql.py`` holds the key scheme and the statements),
on its wake-up listener's connection, and notes that it does
(``SchedulerProcess.locked_at``). The lock lives exactly as long as that session: when
the process is killed (SIGKILL, the OOM killer, a crash), PostgreSQL ends the session and
releases the lock. The look ahead of any other scheduler (``loop/scheduler.py``), which
comes every ``PROBE_INTERVAL`` while a lease is held anywhere, then sees leases whose holder lost
its lock, and its sweep settles them at once, not ``lease_timeout`` later.

Lease expiry stays the rule wherever no lock tells: SQLite, psycopg2, a connection pooler
in transaction mode, and a process alive but frozen (SIGSTOP), whose session, and lock,
stay. A database restart ends every session at once, and each process takes its lock
again as its listener reconnects, within ``wakeups.MAX_RECONNECT_DELAY``. So a process
judges the others only while it holds its own lock and has held it for longer than that
since it last reconnected: after a restart, leases expire as they always did.
"""

from datetime import timedelta
from typing import Any

from django_periodic.db import postgresql
from django_periodic.models import SchedulerProcess

# How often a process looks for dead holders while a lease is held anywhere: the time
# from a kill to the recovery of the victim's runs.
PROBE_INTERVAL = timedelta(seconds=1)


def take(raw_connection: Any, process: SchedulerProcess) -> bool:
    """Take this process's lock on a psycopg connection in autocommit, and note it on the
    process's row; False if another session holds it, or if the connection does not reach
    the database that holds the row (a ``WAKEUP_DATABASE`` of another database): then
    this process holds no lock."""
    key = postgresql.process_key(process.pk)
    if not postgresql.try_lock(raw_connection, key):
        return False
    table = SchedulerProcess._meta.db_table
    noted = raw_connection.execute(
        postgresql.NOTE_LOCKED_SQL.format(process=f'"{table}"'),
        [process.pk, process.host, process.pid],
    )
    if noted.rowcount == 1:
        return True
    postgresql.unlock(raw_connection, key)
    return False


def lost_sql(quote: Any) -> str:
    """The processes that held their lock and hold it no more (``postgresql.LOST_SQL``),
    for a connection's quoting of table names."""
    return postgresql.lost_sql(quote(SchedulerProcess._meta.db_table))
