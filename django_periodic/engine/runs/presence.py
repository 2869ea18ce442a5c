"""Knowing within a second that a scheduler process died: a session lock per process.

On PostgreSQL each ``run_scheduler`` process holds a session-level advisory lock, keyed by
its ``SchedulerProcess`` id, on its wake-up listener's connection, and notes that it does
(``SchedulerProcess.locked_at``). The lock lives exactly as long as that session: when
the process is killed (SIGKILL, the OOM killer, a crash), PostgreSQL ends the session and
releases the lock. The look ahead of any other scheduler (``planning/look_ahead.py``), which comes
every ``PROBE_INTERVAL`` while a lease is held anywhere, then sees leases whose holder lost
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

from django_periodic.models import SchedulerProcess

# How often a process looks for dead holders while a lease is held anywhere: the time
# from a kill to the recovery of the victim's runs.
PROBE_INTERVAL = timedelta(seconds=1)
# The first key of every lock taken here (two-key advisory locks), so that they never
# collide with an application's own: "DP" in ASCII.
LOCK_NAMESPACE = 0x4450
# The advisory-lock form PostgreSQL reports for two int4 keys (pg_locks.objsubid).
_TWO_KEYS = 2


def take(raw_connection: Any, process: SchedulerProcess) -> bool:
    """Take this process's lock on a psycopg connection in autocommit, and note it on the
    process's row; False if another session holds it, or if the connection does not reach
    the database that holds the row (a ``WAKEUP_DATABASE`` of another database): then
    this process holds no lock."""
    key = [LOCK_NAMESPACE, _key(process.pk)]
    cursor = raw_connection.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
    row = cursor.fetchone()
    if not (row and row[0]):
        return False
    table = SchedulerProcess._meta.db_table
    noted = raw_connection.execute(
        f'UPDATE "{table}" SET locked_at = statement_timestamp() '
        "WHERE id = %s AND host = %s AND pid = %s",
        [process.pk, process.host, process.pid],
    )
    if noted.rowcount == 1:
        return True
    raw_connection.execute("SELECT pg_advisory_unlock(%s, %s)", key)
    return False


def _key(process_id: int) -> int:
    # The second key is an int4: ids past 2**31 wrap (a collision needs 2**31 processes).
    return process_id % 2**31


# The processes that held a lock and hold it no more: dead. Only a process that may judge
# asks (see the module's docstring).
LOST_SQL = """
SELECT p.id FROM {process} p
WHERE p.locked_at IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = {two_keys}
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = {namespace} AND l.objid = mod(p.id, 2147483648)::oid
)
"""


def lost_sql(quote: Any) -> str:
    """``LOST_SQL`` for a connection's quoting of table names."""
    return LOST_SQL.format(
        process=quote(SchedulerProcess._meta.db_table),
        two_keys=_TWO_KEYS,
        namespace=LOCK_NAMESPACE,
    )
