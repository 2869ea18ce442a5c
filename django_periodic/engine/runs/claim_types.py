"""What a claim gives: each run claimed with the token of its lease (``Claim``), what a
claim ended without running (``ClaimResult``), who asks and for which runs
(``ClaimRequest``), and the signals for the runs it ended."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.dispatch import Signal

from django_periodic import signals
from django_periodic.db import announcements
from django_periodic.models import Run
from django_periodic.models.run import past_start_deadline
from django_periodic.timing import bounds

LATE_MESSAGE = "No worker could start it within its misfire grace."
UNLEASABLE_MESSAGE = (
    f"Cannot claim: its schedule's lease_timeout would make its lease expire after "
    f"{bounds.LATEST:%Y-%m-%d}, past every time a row may hold."
)


@dataclass(frozen=True)
class Claim:
    """A run this process holds, and the token that proves it (which alone tells claims
    apart: hashing a model instance costs more, and claims are kept in sets and dicts)."""

    run: Run = field(compare=False)
    token: UUID
    using: str = field(default="default", compare=False)
    # When this process made the claim (time.monotonic()), to date the job's real start.
    claimed_at: float = field(default_factory=time.monotonic, compare=False)
    # The database's clock at the claim; None: the run's started_at (claimed when due).
    db_claimed_at: datetime | None = field(default=None, compare=False)

    @property
    def _db_claimed(self) -> datetime | None:
        return self.db_claimed_at or self.run.started_at

    def db_time(self, monotonic: float) -> datetime | None:
        """The database's clock at ``monotonic`` (a later time.monotonic()) as this process
        counts it: the claim's time plus the time since."""
        claimed = self._db_claimed
        if claimed is None:
            return None
        return claimed + timedelta(seconds=monotonic - self.claimed_at)

    def too_late(self, at: datetime | None) -> bool:
        """Whether a first start at ``at`` comes past the run's start deadline (it waited
        for a thread, claimed ahead, while all were busy): it must be skipped instead."""
        # Claimed, its first attempt is 1: until then it was not started (attempt 0).
        if self.run.attempt != 1 or at is None:
            return False
        return past_start_deadline(self.run.start_deadline, at)

    def starts_at(self) -> float:
        """When the run may start (time.monotonic()): at once, or at its release if it was
        claimed ahead of it."""
        claimed, release = self._db_claimed, self.run.release_time
        if claimed is None or release <= claimed:
            return self.claimed_at
        return self.claimed_at + (release - claimed).total_seconds()


@dataclass
class ClaimResult:
    claims: list[Claim] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # schedules of the runs skipped as late
    refused: list[int] = field(default_factory=list)  # ...and of those failed cannot_claim

    def __add__(self, other: ClaimResult) -> ClaimResult:
        return ClaimResult(
            self.claims + other.claims, self.late + other.late, self.refused + other.refused
        )


@dataclass(frozen=True)
class ClaimRequest:
    """Who claims (the lease's holder and process), and which runs: those its workers
    execute, or one run by id (a tasks backend's worker); of its ``jobs`` only, those its
    code registers (a process of another release may have others: see fleet.py)."""

    holder: str
    jobs: tuple[str, ...]
    process_id: int | None = None
    run_id: int | None = None
    # The claiming thread calls the job right after the claim (a tasks backend's worker):
    # the claim marks the lease started too (starts.py marks the others).
    starts_at_once: bool = False


def announce_ended(run_ids: list[int], signal: Signal, using: str, **extra: Any) -> None:
    """``signal`` for runs a claim ended without running them: ``run_skipped`` for those
    past their start deadline, ``run_finished`` for those it failed (rare: one query)."""
    if run_ids and signals.listened(signal):
        ended = Run.objects.using(using).filter(pk__in=run_ids).select_related("schedule")
        announcements.send_on_commit((signals.of_run(signal, r, **extra) for r in ended), using)
