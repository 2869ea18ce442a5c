"""The SQLite ledger, and the base of every ledger backend: each operation through the ORM,
a few statements where the PostgreSQL backend sends one; the same rows in the end.

One instance per alias (``backends.ledger``), which knows its alias. The PostgreSQL backend
subclasses it and overrides only its statements; a method not overridden is the ORM's on
both. The engine hands each method what it decided, as plain records (``engine/records.py``):
a backend writes and reads, and never calls back into the engine.
"""

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Q
from django.db.models.expressions import RawSQL

from django_periodic.engine.backends.sqlite import claims, fires, reading, runs
from django_periodic.engine.records import (
    AttemptOutcome,
    BackfilledRow,
    ClaimRequest,
    ClaimResult,
    Decision,
    Horizon,
    InRange,
    LateRun,
    PlannedRow,
    Recorded,
)
from django_periodic.models import LeaseQuerySet, Run, RunQuerySet, Schedule


class SQLiteLedger:
    """What writes and reads the runs on one database (``using``)."""

    #: What planning loads of a due schedule besides ``planner.DECISION_FIELDS``.
    SNAPSHOT_COLUMNS_LOADED: tuple[str, ...] = fires.SNAPSHOT_COLUMNS_LOADED
    #: Whether ``record_outcomes`` writes a batch in one statement (no transaction needed).
    RECORDS_IN_ONE_STATEMENT = False

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.using!r}>"

    # Planning (engine/planning)

    def record_fires(
        self, decisions: list[Recorded], now: datetime, inserted: list[PlannedRow] | None
    ) -> list[Decision]:
        """Move each cursor by compare-and-set, insert the runs of the schedules whose
        cursor moved; return the decisions applied (and add the rows inserted to
        ``inserted``). The retries the fires supersede have ended first."""
        return fires.record_fires(decisions, now, self.using, inserted)

    def insert_backfill(
        self, schedule: Schedule, in_range: InRange, now: datetime, spacing: timedelta
    ) -> list[BackfilledRow]:
        """Insert a run for each plan time of ``in_range`` that has none, released
        ``spacing`` apart after the schedule's last waiting backfilled run."""
        return fires.insert_backfill(schedule, in_range, now, spacing, self.using)

    def insert_new_runs(self, runs: list[Run]) -> list[PlannedRow]:
        """Insert these scheduled runs but those whose (schedule, scope, plan time) has a
        run already (another process recorded it first); return the rows inserted."""
        return fires.insert_new_runs(runs, self.using)

    def recorded(self, schedule: Schedule, in_range: InRange) -> set[tuple[str, datetime]]:
        """The (scope, plan time) pairs of ``in_range`` that have a run of any trigger."""
        return fires.recorded(schedule, in_range, self.using)

    def look_ahead(self, jobs: tuple[str, ...], judge: bool) -> Horizon:
        """The earliest time of each kind of coming work (``Horizon``), of runs of ``jobs``
        (``judge``: whether a lease is held by a process known to have died)."""
        return reading.look_ahead(self.using, jobs)

    def of_schedules(self, schedule_ids: list[int]) -> Q | RawSQL:
        """A filter of runs to those of these schedules."""
        return runs.of_schedules(self.using, schedule_ids)

    # A run's life (engine/runs)

    def claim(
        self,
        wanted: ClaimRequest,
        now: datetime | None,
        limit: int,
        ahead: timedelta | None,
    ) -> ClaimResult:
        """Claim up to ``limit`` runs that may start (``ahead``: due within it), under
        fresh leases; skip those past their start deadline, fail those that cannot be
        leased (the result names them: the engine sends their signals)."""
        return claims.claim(wanted, now, limit, self.using, ahead)

    def claimable(
        self, wanted: ClaimRequest, now: datetime, ahead: timedelta | None
    ) -> RunQuerySet:
        """The runs a claim takes, oldest first."""
        return claims.claimable(wanted, now, ahead, self.using)

    def fail_waiting(self, run_ids: list[int], code: str, message: str) -> list[tuple[int, int]]:
        """Fail those of these runs still waiting to start; return them (id, schedule id)."""
        return claims.fail_waiting(run_ids, code, message, self.using)

    def skip_late(self, now: datetime) -> ClaimResult:
        """Skip the runs too late to start at ``now``; the result names them."""
        return claims.skip_late(now, self.using)

    def mark_started(self, tokens: list[UUID]) -> set[UUID]:
        """Mark these leases started at the database's clock; return those marked (a lease
        lost meanwhile is not, and its job must not start)."""
        return runs.mark_started(tokens, self.using)

    def held_to_extend(
        self, held: LeaseQuerySet, tokens: Collection[UUID], process_id: int
    ) -> LeaseQuerySet:
        """The leases of ``tokens`` among ``held`` that a heartbeat extends."""
        return runs.held_to_extend(held, tokens, process_id, self.using)

    def expired_or_orphaned(self, now: datetime) -> LeaseQuerySet:
        """Leases held past their expiry, or by a process known to be dead."""
        return runs.expired_or_orphaned(now, self.using)

    def flag_late(self, now: datetime) -> list[LateRun]:
        """Flag the runs unfinished past their deadline to finish at ``now`` (``late_at``)
        and return them, each to one caller only, however many flag at once."""
        return runs.flag_late(now, self.using)

    def record_outcomes(self, outcomes: Sequence[AttemptOutcome], now: datetime | None) -> set[int]:
        """Release each outcome's lease if still held and write its run, in one
        transaction; return the runs written."""
        return runs.record_outcomes(outcomes, now, self.using)

    # Reads (admin, operations): their callers name the alias (that of this instance).

    def recent_runs(self, ids: list[int], using: str, limit: int) -> Iterable[tuple[Any, ...]]:
        """The newest ``limit`` runs of each schedule, as ``RECENT_RUN_FIELDS``."""
        return reading.recent_runs(ids, using, limit)

    def fire_lag(
        self, since: datetime, using: str
    ) -> tuple[int, timedelta | None, timedelta | None]:
        """First attempts started since ``since``: how many, their lag's p50 and p99."""
        return reading.fire_lag(since, using)

    def run_series(
        self, since: datetime, until: datetime, unit: str, using: str
    ) -> list[tuple[datetime, int, timedelta | None, timedelta | None]]:
        """Runs started in [``since``, ``until``) per ``unit`` (minute or hour, UTC), oldest
        first, buckets without runs left out: (start, runs, lag p50, lag p99)."""
        return reading.run_series(since, until, unit, using)
