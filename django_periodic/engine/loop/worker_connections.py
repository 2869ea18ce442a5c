"""A worker thread's database connections, kept from one run to the next.

Django closes a connection at the end of a request when ``CONN_MAX_AGE`` is 0 (its
default), so ``close_old_connections()`` between runs would start a new database backend
for every run: on PostgreSQL, several milliseconds, more than most jobs take. A worker
thread is not a request: it keeps its connections whatever ``CONN_MAX_AGE`` says, and
replaces only one that cannot serve the next run as a fresh one would:

- a connection the server closed (a restart, a failover, an idle timeout);
- one a job left inside a transaction: an ``atomic()`` block never exited, autocommit
  turned off, a transaction begun or aborted by raw SQL.

No run sees another run's transaction. The checks cost no round trip to the database,
except after a database error, when Django's own ``is_usable()`` decides.
"""

import contextlib

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_periodic.db import features


def prepare_for_run() -> int:
    """Before a run on this thread: keep each of its connections that is clean, replace
    the others with fresh ones (opened when first used). Returns how many were replaced."""
    replaced = 0
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or is_clean(connection):
            continue
        discard(connection)
        replaced += 1
    return replaced


def all_clean() -> bool:
    """Whether every open connection of this thread is clean (``is_clean``)."""
    return all(
        is_clean(connection)
        for connection in connections.all(initialized_only=True)
        if connection.connection is not None
    )


def discard(connection: BaseDatabaseWrapper) -> None:
    """Close a connection and forget its wrapper's state, so the next use starts afresh.

    Closing alone keeps the wrapper's transaction bookkeeping (an ``atomic()`` block left
    open marks it for rollback), which would fail the next run's first query.
    """
    with contextlib.suppress(Exception):  # a broken one may fail to close: gone either way
        connection.close()
    del connections[connection.alias]


def is_clean(connection: BaseDatabaseWrapper) -> bool:
    """Whether a connection is open, idle outside any transaction, in autocommit mode, and
    not closed by the server: as a new one would be."""
    if connection.in_atomic_block or connection.needs_rollback:
        return False
    if not connection.get_autocommit():
        return False
    if connection.errors_occurred:
        # A query failed: the connection may be broken. Ask once, as Django does.
        if not connection.is_usable():
            return False
        connection.errors_occurred = False
    # Whether the driver's connection is inside a transaction, or no longer usable.
    return not features(connection.alias).in_transaction(connection.connection)
