"""A cursor whose statements the PostgreSQL server keeps prepared (psycopg 3).

Django's psycopg cursors bind parameters on the client, so the server parses and plans
every statement anew. Our claim, outcome and start-mark statements are long CTEs run
hundreds of times a second under load: the planner alone took 1.7 ms a claim and 0.6 ms a
batch of outcomes, a fifth of the database's time per run of a one-INSERT job. Through
this cursor psycopg prepares each statement at its first execution on a connection, and
the server plans it once.

Django turns psycopg's preparing off on its connections (``prepare_threshold`` None), which
jobs share, so the cursor turns it on for its own statement only. Whether our statements
are prepared at all is ``pooling.prepares``: not with ``prepare_threshold`` None in the
database's ``OPTIONS``, nor by default through a transaction pooler.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import connections

from django_periodic.db import features, pooling

# psycopg's threshold while our statement runs: any number; ``prepare=True`` prepares at once.
_WHILE_OURS = 1


@contextmanager
def cursor(using: str) -> Iterator[Any]:
    """Django's cursor on ``using`` (its error wrapping, query logging and execute wrappers
    apply) over a psycopg 3 cursor that binds on the server and prepares; a plain Django
    cursor on another driver or database, or when ``OPTIONS`` turn preparing off."""
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    preparing = features(using).has_psycopg and hasattr(raw, "prepare_threshold")
    if not (preparing and pooling.prepares(using)):
        with connection.cursor() as plain:
            yield plain
        return
    with connection.wrap_database_errors:
        wrapped = connection._prepare_cursor(_preparing_cursor_class()(raw))  # type: ignore[attr-defined]
    with wrapped:
        yield wrapped


@cache
def _preparing_cursor_class() -> type[Any]:
    import psycopg

    class PreparingCursor(psycopg.Cursor[Any]):
        """Prepares each statement it executes, leaving the connection's threshold (which
        the jobs' queries follow) as it was."""

        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            connection = self.connection
            threshold = connection.prepare_threshold
            if threshold is None:
                connection.prepare_threshold = _WHILE_OURS
            try:
                return super().execute(query, params, prepare=True, **options)
            finally:
                connection.prepare_threshold = threshold

    return PreparingCursor
