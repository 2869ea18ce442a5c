"""PostgreSQL's session statements, named, one place per concern: the clock, wake-ups
(NOTIFY and LISTEN), the advisory locks (one key scheme), a process's presence, the
fragments that read and release leases, and whether a session is idle.

Only the modules that use a session call these, each after asking ``db.features(using)``
whether the database has them: ``db/clock.py``, ``db/announcements.py``,
``engine/loop/wakeups.py``, ``engine/runs/presence.py``, ``operations/retention.py``, the
PostgreSQL ledger backend, and ``engine/loop/worker_connections.py``. Nothing here needs
the models: a statement that names a table is given its quoted name.
"""

import select
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# -- the clock ---------------------------------------------------------------------------------

# statement_timestamp(), unlike now(), advances inside a long transaction.
CLOCK_SQL = "SELECT statement_timestamp()"

# -- wake-ups ----------------------------------------------------------------------------------

#: The schedulers' channel.
CHANNEL = "django_periodic"
# Delivered at the commit of the transaction it is sent in (at once in autocommit).
NOTIFY_SQL = "SELECT pg_notify(%s, '')"
LISTEN_SQL = f"LISTEN {CHANNEL}"


def notify(cursor: Any) -> None:
    """Send a wake-up on the schedulers' channel through ``cursor``."""
    cursor.execute(NOTIFY_SQL, [CHANNEL])


def can_listen() -> bool:
    """Whether the driver can wait for a notification with a timeout (psycopg 3 can;
    psycopg2 has no blocking wait for notifications)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


# -- advisory locks ----------------------------------------------------------------------------
#
# Every lock taken here is a session-level advisory lock of two int4 keys: LOCK_NAMESPACE
# first, so that they never collide with an application's own, then what is locked. A
# process's presence takes its id (mod 2**31: from 0 up); a purpose of one lock for the
# whole database takes a negative key, which no process id reaches.

#: The first key of every lock: "DP" in ASCII.
LOCK_NAMESPACE = 0x4450
#: One pruner at a time (operations/retention.py).
PRUNING = -1
# The advisory-lock form PostgreSQL reports for two int4 keys (pg_locks.objsubid).
TWO_KEYS = 2

TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s, %s)"
LOCK_SQL = "SELECT pg_advisory_lock(%s, %s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, %s)"


def process_key(process_id: int) -> int:
    """A process's presence key: ids past 2**31 wrap (a collision needs 2**31 processes)."""
    return process_id % 2**31


def try_lock(raw_connection: Any, key: int) -> bool:
    """Take lock ``key`` on a psycopg connection if no other session holds it; whether
    taken."""
    row = raw_connection.execute(TRY_LOCK_SQL, [LOCK_NAMESPACE, key]).fetchone()
    return bool(row and row[0])


def unlock(raw_connection: Any, key: int) -> None:
    """Release lock ``key`` held on a psycopg connection."""
    raw_connection.execute(UNLOCK_SQL, [LOCK_NAMESPACE, key])


@contextmanager
def one_at_a_time(connection: Any, key: int, wait: bool) -> Iterator[bool]:
    """Hold lock ``key`` on a Django connection's session while inside; yield whether it
    was got (``wait``: wait for it). Freed with the session if the process dies."""
    with connection.cursor() as cursor:
        if wait:
            cursor.execute(LOCK_SQL, [LOCK_NAMESPACE, key])
            got = True
        else:
            cursor.execute(TRY_LOCK_SQL, [LOCK_NAMESPACE, key])
            got = bool(cursor.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute(UNLOCK_SQL, [LOCK_NAMESPACE, key])


# -- presence (engine/runs/presence.py) --------------------------------------------------------

# A process notes on its row that it holds its lock (the row is only ever its own).
NOTE_LOCKED_SQL = (
    "UPDATE {process} SET locked_at = statement_timestamp() "
    "WHERE id = %s AND host = %s AND pid = %s"
)

# The processes that held a lock and hold it no more: dead. Only a process that may judge
# asks (see presence.py). A lock of two int4 keys shows its first as classid, its second as
# objid (an oid: a negative key shows past 2**31, so never as a process's).
LOST_SQL = """
SELECT p.id FROM {process} p
WHERE p.locked_at IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = {two_keys}
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = {namespace} AND l.objid = mod(p.id, 2147483648)::oid
)
"""


def lost_sql(process_table: str) -> str:
    """``LOST_SQL`` on the processes' table, quoted."""
    return LOST_SQL.format(process=process_table, two_keys=TWO_KEYS, namespace=LOCK_NAMESPACE)


# -- leases (models/processes.py says the same through the ORM) --------------------------------

# A lease still held, for statements that read leases as ``l``: ``processes.HELD``.
HELD_SQL = "l.released_at IS NULL"
# What releasing a lease writes: ``LeaseQuerySet.release``. A released lease no longer
# names its process (``holder`` still does): a process's row then goes (at its stop, or
# forgotten by the sweeper) without rewriting the history of every run it ever executed,
# and the index on ``process`` holds only held leases.
RELEASE_SQL = "released_at = {now}, outcome = {outcome}, process_id = NULL"

# -- whether a session is idle (engine/loop/worker_connections.py) -----------------------------

# libpq's PQTRANS_IDLE, as psycopg 3 and psycopg2 report it: no transaction open.
_PQTRANS_IDLE = 0


def in_transaction(raw: Any) -> bool:
    """Whether a driver's connection is inside a transaction, or no longer usable."""
    if raw.closed or getattr(raw, "broken", False):
        return True
    if raw.info.transaction_status != _PQTRANS_IDLE:
        return True
    # An idle connection has nothing to read. Something readable is the server saying it
    # is going away (or has gone: end of file), which the driver learns only on the next
    # query; one select() call, no round trip.
    readable, _, _ = select.select([raw.fileno()], [], [], 0)
    return bool(readable)
