"""The records the engine's steps and the ledger backends pass each other: how an attempt
ended (``AttemptOutcome``, ``Failure``), what the look ahead found (``Horizon``), a
backfill's range and the runs it inserted, a run the planner recorded. Plain data: the
modules that make them own the rules."""

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django_periodic.engine.runs.claim_types import Claim


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed; ``retryable`` False fails the run even with attempts left."""

    code: str
    message: str
    traceback: str = ""
    retryable: bool = True


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt ended: the lease's outcome and the run's new state.

    Built by the functions below, whose result and error texts are as they will be stored
    (``storable_result``, ``storable_text``).
    """

    claim: Claim
    lease_outcome: str
    status: str
    result_json: str | None = None  # the result as stored, in JSON (one encoding per run)
    error_code: str = ""
    error_message: str = ""
    traceback: str = ""
    retry_in: timedelta | None = None
    interrupted: bool = False  # cut short by its process stopping (counts as no attempt)
    started_at: datetime | None = None  # when the job really started, if after the claim
    recorded: bool = False  # already recorded, with an atomic job's writes (runs/atomic.py)

    @property
    def result(self) -> Any:
        """The result as stored (``storable.storable_result``)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def started(self, at: datetime | None) -> "AttemptOutcome":
        return replace(self, started_at=at)


@dataclass(frozen=True)
class Horizon:
    now: datetime  # the database's clock
    next_fire: datetime | None  # earliest cursor of an enabled schedule
    next_retry: datetime | None  # earliest retry of a run waiting to retry (not enqueued)
    next_expiry: datetime | None  # earliest expiry of a lease still held, by any process
    next_pending: datetime | None  # earliest release of a run our workers may claim
    next_handoff: datetime | None  # earliest release of a handed-off run not enqueued
    next_enqueued: datetime | None  # earliest enqueue of a handed-off run still waiting
    # A lease is held by a process that lost its session lock: it died (presence.py).
    orphaned: bool = False

    def claimable(self) -> bool:
        """A run may be claimed to start now."""
        retry_due = self.next_retry is not None and self.next_retry <= self.now
        return _reached(self.next_pending, self.now) or retry_due

    def claimable_ahead(self, ahead: timedelta) -> bool:
        """A pending run is due within ``ahead``: it may be claimed to start on time."""
        return _reached(self.next_pending, self.now + ahead)

    def fire_due(self, ahead: timedelta = timedelta(0)) -> bool:
        """A schedule fires within ``ahead`` (now, by default)."""
        return _reached(self.next_fire, self.now + ahead)

    def handoff_due(self, pickup_timeout: timedelta) -> bool:
        """A handed-off run may start (or be retried) and has no task yet, or its task has
        waited past ``pickup_timeout`` (presumed lost): dispatch."""
        enqueued = self.next_enqueued
        redeliver = None if enqueued is None else enqueued + pickup_timeout
        due = (self.next_handoff, self.next_retry, redeliver)
        return any(_reached(at, self.now) for at in due)

    def lease_expired(self) -> bool:
        """A lease expired, or its holder died: sweep."""
        expired = self.next_expiry is not None and self.next_expiry < self.now
        return expired or self.orphaned


def _reached(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


# A run inserted: its id, scope, plan time and release time.
BackfilledRow = tuple[int, str, datetime, datetime]


@dataclass(frozen=True)
class InRange:
    start: datetime
    end: datetime
    times: list[datetime]
    scopes: list[str]

    @property
    def count(self) -> int:
        return len(self.times) * len(self.scopes)


# A run recorded: (id, schedule id, scope, plan time, status, error code).
PlannedRow = tuple[int | None, int, str, datetime, str, str]
