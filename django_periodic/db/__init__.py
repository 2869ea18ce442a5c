"""What differs between the databases the package runs on, chosen once per alias, as Django
chooses ``connection.ops`` and ``connection.features``: the only place that asks which
database an alias is.

``features(using)`` says what the database can do (its own clock, notifications, session
locks, prepared statements) and which ledger backend writes and reads the runs there
(``engine/backends``: PostgreSQL's own SQL, or the ORM's, SQLite's). Any other database
is refused by the system checks (``supported``): the ledger's statements are tested on
these two only. PostgreSQL's session statements are in ``postgresql.py``.

``ledger(using)`` is the one seam from the models to the engine: the operations the models'
thin methods (``run_now()``, ``backfill()``, ``cancel()``, overrides) ask of it
(``RunOperations``), implemented by ``engine/operations.py``, loaded once by its path, as
Django loads a database backend, so that the models need not import the engine, which
imports them.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import import_module
from typing import Any, Protocol, cast

from django.db import InterfaceError, OperationalError, connections
from django.db.utils import load_backend

from django_periodic.db import postgresql

# Errors of the database or the connection, never one row's: the loop retries them (with
# backoff) rather than failing a schedule or a run for them. Any other exception while
# handling one schedule or one run is that row's failure.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


def _never(raw: Any) -> bool:
    return False


def _sqlite_in_transaction(raw: Any) -> bool:
    return bool(raw.in_transaction)


@dataclass(frozen=True)
class Features:
    """What one kind of database can do, as far as the package cares."""

    #: Dotted path of the ledger backend class (see ``engine/backends``).
    ledger: str
    #: The database's name, as messages say it.
    name: str
    #: Whether the package supports it: its statements are tested on PostgreSQL and SQLite
    #: only, and the system checks refuse any other (``checks.py``).
    supported: bool = True
    #: Whether the database has a clock of its own to read: else this machine's is used.
    has_clock: bool = False
    #: Whether it can NOTIFY and LISTEN (wake-ups) and hold session locks (presence, pruning).
    has_sessions: bool = False
    #: Whether the driver may prepare statements and parse timestamps once (psycopg 3).
    has_psycopg: bool = False
    #: Whether a write transaction must take its lock when it begins (SQLite's
    #: ``transaction_mode`` ``IMMEDIATE``), or two planners can plan the same fire.
    needs_immediate_transactions: bool = False
    #: Whether the driver's connection is inside a transaction (or unusable); by default,
    #: only what Django itself can tell.
    in_transaction: Callable[[Any], bool] = _never

    def can_listen(self) -> bool:
        """Whether a wake-up listener can wait here: sessions, and a driver that waits for
        a notification with a timeout (psycopg 3)."""
        return self.has_sessions and postgresql.can_listen()


POSTGRESQL = Features(
    ledger="django_periodic.engine.backends.postgresql.PostgreSQLLedger",
    name="PostgreSQL",
    has_clock=True,
    has_sessions=True,
    has_psycopg=True,
    in_transaction=postgresql.in_transaction,
)
SQLITE = Features(
    ledger="django_periodic.engine.backends.sqlite.SQLiteLedger",
    name="SQLite",
    needs_immediate_transactions=True,
    in_transaction=_sqlite_in_transaction,
)
# Any other database: refused by the system checks (``supported``), its ledger the ORM's.
OTHER = Features(
    ledger="django_periodic.engine.backends.sqlite.SQLiteLedger",
    name="another database",
    supported=False,
)


def features(using: str) -> Features:
    """What the database behind ``using`` can do."""
    return _of_backend(connections[using])


def features_of(database: dict[str, Any]) -> Features:
    """What the database of a ``DATABASES`` entry can do, read from its ``ENGINE`` without
    connecting (the system checks read the settings): an engine that cannot be loaded is
    another database."""
    try:
        wrapper = load_backend(database.get("ENGINE", "")).DatabaseWrapper
    except Exception:  # not installed, or no engine at all: Django reports it on first use
        return OTHER
    return _of_backend(wrapper)


def _of_backend(wrapper: Any) -> Features:
    """The features of a Django database backend (a connection, or its class)."""
    return _by_vendor(wrapper.vendor)


@cache
def _by_vendor(vendor: str) -> Features:
    return {"postgresql": POSTGRESQL, "sqlite": SQLITE}.get(vendor, OTHER)


class RunOperations(Protocol):
    """What the models' thin methods ask of the ledger (the engine implements it)."""

    def cancel(self, runs: Any, now: datetime) -> tuple[int, int]: ...

    def override_runs(self, runs: Any, override: Any, now: datetime) -> int: ...

    def backfill(
        self, schedule: Any, start: datetime, end: datetime, *, rate: float | None, now: Any
    ) -> Any: ...

    def plan_extra_runs(
        self,
        schedule: Any,
        now: datetime,
        *,
        trigger: str,
        plan_time: datetime,
        scopes: list[str],
        **snapshot: Any,
    ) -> list[Any]: ...


# The engine's module that implements RunOperations.
OPERATIONS = "django_periodic.engine.operations"


def ledger(using: str) -> RunOperations:
    """The engine's operations the models' thin methods call (``OPERATIONS``), the same on
    every database: each calls the ledger backend of its rows' alias."""
    return _operations()


@cache
def _operations() -> RunOperations:
    return cast(RunOperations, import_module(OPERATIONS))
