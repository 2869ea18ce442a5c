"""The ledger's backends: what writes and reads the runs, one implementation per kind of
database, chosen once per alias (``db.features``), as Django chooses ``connection.ops``.

- ``postgresql``: our own statements, each operation one round trip where it can be;
- ``portable``: the ORM, on any database Django supports (SQLite in development).

``Ledger`` is what both provide. The engine's modules own the rules and the flow (what a
claim takes, how an outcome is decided) and call ``ledger(using)`` for the statements; the
fallback of a batch the database refuses, one row at a time, is the engine's
(``engine/batches.py``), the same for both.
"""

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast
from uuid import UUID

from django.db.models import Q
from django.db.models.expressions import RawSQL

from django_periodic import db

if TYPE_CHECKING:
    from django_periodic.engine.planning.planned import Decision
    from django_periodic.engine.records import (
        AttemptOutcome,
        BackfilledRow,
        Horizon,
        InRange,
        PlannedRow,
    )
    from django_periodic.engine.runs.claim_types import ClaimRequest, ClaimResult
    from django_periodic.models import LeaseQuerySet, Schedule


class Ledger(db.RunOperations, Protocol):
    """The operations whose statements differ between the backends."""

    # Planning (engine/planning)

    #: What planning loads of a due schedule besides ``planner.DECISION_FIELDS``.
    SNAPSHOT_COLUMNS_LOADED: tuple[str, ...]

    def record_fires(
        self,
        decisions: "list[Decision]",
        now: datetime,
        using: str,
        inserted: "list[PlannedRow] | None",
    ) -> "list[Decision]":
        """Move each cursor by compare-and-set, end the retries new fires supersede, insert
        the runs of the schedules whose cursor moved; return the decisions applied (and add
        the rows inserted to ``inserted``)."""

    def insert_backfill(
        self,
        schedule: "Schedule",
        in_range: "InRange",
        now: datetime,
        spacing: timedelta,
        using: str,
    ) -> "list[BackfilledRow]":
        """Insert a run for each plan time of ``in_range`` that has none, released
        ``spacing`` apart after the schedule's last waiting backfilled run."""

    def look_ahead(self, using: str, judge: bool) -> "Horizon":
        """The earliest time of each kind of coming work (``Horizon``)."""

    def of_schedules(self, using: str, schedule_ids: list[int]) -> Q | RawSQL:
        """A filter of runs to those of these schedules."""

    # A run's life (engine/runs)

    def claim(
        self,
        wanted: "ClaimRequest",
        now: datetime | None,
        limit: int,
        using: str,
        ahead: timedelta | None,
    ) -> "ClaimResult":
        """Claim up to ``limit`` runs that may start (``ahead``: due within it), under
        fresh leases; skip those past their start deadline, fail those that cannot be
        leased."""

    def mark_started(self, tokens: list[UUID], using: str) -> set[UUID]:
        """Mark these leases started at the database's clock; return those marked (a lease
        lost meanwhile is not, and its job must not start)."""

    def held_to_extend(
        self, held: "LeaseQuerySet", tokens: Collection[UUID], process_id: int, using: str
    ) -> "LeaseQuerySet":
        """The leases of ``tokens`` among ``held`` that a heartbeat extends."""

    def expired_or_orphaned(self, now: datetime, using: str) -> "LeaseQuerySet":
        """Leases held past their expiry, or by a process known to be dead."""

    def record_outcomes(
        self, outcomes: "Sequence[AttemptOutcome]", now: datetime | None, using: str
    ) -> set[int]:
        """Release each outcome's lease if still held and write its run, in one
        transaction; return the runs written."""

    # Reads (admin, operations)

    def recent_runs(self, ids: list[int], using: str, limit: int) -> Iterable[tuple[Any, ...]]:
        """The newest ``limit`` runs of each schedule, as ``RECENT_RUN_FIELDS``."""

    def fire_lag(
        self, since: datetime, using: str
    ) -> tuple[int, timedelta | None, timedelta | None]:
        """First attempts started since ``since``: how many, their lag's p50 and p99."""

    def run_series(
        self, since: datetime, until: datetime, unit: str, using: str
    ) -> list[tuple[datetime, int, timedelta | None, timedelta | None]]:
        """Runs started in [``since``, ``until``) per ``unit`` (minute or hour, UTC), oldest
        first, buckets without runs left out: (start, runs, lag p50, lag p99)."""


def ledger(using: str) -> Ledger:
    """The ledger backend of the database ``using``."""
    return cast(Ledger, db.ledger(using))
