"""What differs between the databases the package runs on, chosen once per alias, as Django
chooses ``connection.ops`` and ``connection.features``: the only place that asks which
database an alias is.

``features(using)`` says what the database can do (its own clock, notifications, session
locks, prepared statements) and which ledger backend writes and reads the runs there
(``engine/backends``: PostgreSQL's own SQL, or the ORM's, SQLite's).

``ledger(using)`` is the one seam from the models to the engine: the operations the models'
thin methods (``run_now()``, ``backfill()``, ``cancel()``, overrides) ask of it
(``RunOperations``), implemented by ``engine/operations.py``, loaded once by its path, as
Django loads a database backend, so that the models need not import the engine, which
imports them.
"""

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import import_module
from typing import Any, Protocol, cast

from django.db import InterfaceError, OperationalError, connections

# Errors of the database or the connection, never one row's: the loop retries them (with
# backoff) rather than failing a schedule or a run for them. Any other exception while
# handling one schedule or one run is that row's failure.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


@dataclass(frozen=True)
class Features:
    """What one kind of database can do, as far as the package cares."""

    #: Dotted path of the ledger backend class (see ``engine/backends``).
    ledger: str
    #: Whether the database has a clock of its own to read: else this machine's is used.
    has_clock: bool = False
    #: Whether it can NOTIFY and LISTEN (wake-ups) and hold session locks (presence, pruning).
    has_sessions: bool = False
    #: Whether the driver may prepare statements and parse timestamps once (psycopg 3).
    has_psycopg: bool = False
    #: How to ask the driver's connection whether it is inside a transaction (or unusable);
    #: None: only what Django itself can tell.
    in_transaction: str | None = None


POSTGRESQL = Features(
    ledger="django_periodic.engine.backends.postgresql.PostgreSQLLedger",
    has_clock=True,
    has_sessions=True,
    has_psycopg=True,
    in_transaction="postgresql",
)
SQLITE = Features(
    ledger="django_periodic.engine.backends.sqlite.SQLiteLedger", in_transaction="sqlite"
)
OTHER = Features(ledger="django_periodic.engine.backends.sqlite.SQLiteLedger")


def features(using: str) -> Features:
    """What the database behind ``using`` can do."""
    return _by_vendor(connections[using].vendor)


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
