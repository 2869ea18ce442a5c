"""The PostgreSQL ledger: our own statements, most operations one round trip, with arrays
as parameters, prepared on the server, timestamps parsed once (``db/``). It overrides the
SQLite ledger's statements; what it does not override is the ORM's on both."""

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Q
from django.db.models.expressions import RawSQL

from django_periodic.engine.backends.postgresql import claims, fires, look_ahead, reading, runs
from django_periodic.engine.backends.sqlite import SQLiteLedger
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
from django_periodic.models import LeaseQuerySet, Run, Schedule


class PostgreSQLLedger(SQLiteLedger):
    SNAPSHOT_COLUMNS_LOADED = fires.SNAPSHOT_COLUMNS_LOADED
    RECORDS_IN_ONE_STATEMENT = True

    def record_fires(
        self, decisions: list[Recorded], now: datetime, inserted: list[PlannedRow] | None
    ) -> list[Decision]:
        return fires.record_fires(decisions, now, self.using, inserted)

    def insert_backfill(
        self, schedule: Schedule, in_range: InRange, now: datetime, spacing: timedelta
    ) -> list[BackfilledRow]:
        return fires.insert_backfill(schedule, in_range, now, spacing, self.using)

    def insert_new_runs(self, runs: list[Run]) -> list[PlannedRow]:
        return fires.insert_new_runs(runs, self.using)

    def look_ahead(self, jobs: tuple[str, ...], judge: bool) -> Horizon:
        return look_ahead.look_ahead(self.using, jobs, judge)

    def of_schedules(self, schedule_ids: list[int]) -> Q | RawSQL:
        return runs.of_schedules(self.using, schedule_ids)

    def claim(
        self,
        wanted: ClaimRequest,
        now: datetime | None,
        limit: int,
        ahead: timedelta | None,
    ) -> ClaimResult:
        return claims.claim(wanted, now, limit, self.using, ahead)

    def mark_started(self, tokens: list[UUID]) -> set[UUID]:
        return runs.mark_started(tokens, self.using)

    def held_to_extend(
        self, held: LeaseQuerySet, tokens: Collection[UUID], process_id: int
    ) -> LeaseQuerySet:
        return runs.held_to_extend(held, tokens, process_id, self.using)

    def expired_or_orphaned(self, now: datetime) -> LeaseQuerySet:
        return runs.expired_or_orphaned(now, self.using)

    def flag_late(self, now: datetime) -> list[LateRun]:
        return runs.flag_late(now, self.using)

    def record_outcomes(self, outcomes: Sequence[AttemptOutcome], now: datetime | None) -> set[int]:
        return runs.record_outcomes(outcomes, now, self.using)

    def recent_runs(self, ids: list[int], using: str, limit: int) -> Iterable[tuple[Any, ...]]:
        return reading.recent_runs(ids, using, limit)

    def fire_lag(
        self, since: datetime, using: str
    ) -> tuple[int, timedelta | None, timedelta | None]:
        return reading.fire_lag(since, using)

    def run_series(
        self, since: datetime, until: datetime, unit: str, using: str
    ) -> list[tuple[datetime, int, timedelta | None, timedelta | None]]:
        return reading.run_series(since, until, unit, using)
