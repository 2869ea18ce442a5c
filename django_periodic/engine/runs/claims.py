"""Claiming runs: a batch of runs that may start becomes ``running`` under fresh leases.

On PostgreSQL a claim is one statement, whatever its size: it locks the oldest claimable
runs (skipping rows other processes hold), skips those past their start deadline, marks
the rest running and inserts their leases, all at the database's clock
(``backends/postgresql/claims.py`` holds that statement). Elsewhere the same happens
through the ORM in one transaction (``backends/sqlite/claims.py``). This module sends the
signals of the runs a claim ended without running them.

A run that cannot be claimed fails alone (``cannot_claim``): one whose lease would expire
past the range of stored times (its schedule's ``lease_timeout`` is out of range) is failed
by the claim itself, and if a claim fails as a whole, its runs are claimed again one at a
time to find the one at fault.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction

from django_periodic import signals
from django_periodic.choices import ErrorCode
from django_periodic.db import announcements, clock
from django_periodic.engine import batches, fleet, overlap
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import Claim, ClaimRequest, ClaimResult
from django_periodic.error_texts import error_text
from django_periodic.models import SchedulerProcess

logger = logging.getLogger("django_periodic")


def claim(
    process: SchedulerProcess,
    now: datetime | None,
    limit: int,
    using: str = "default",
    *,
    ahead: timedelta | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` runs that may start now, skipping rows other processes hold.

    ``now`` None means the database's clock at the statement (no clock read first). With
    ``ahead``, claim instead pending runs due within ``ahead`` of now and not yet: the
    caller holds them until their plan time, so that they start on time. Only runs that
    ``run_scheduler``'s own workers execute are claimed (none handed to a tasks backend).
    """
    wanted = ClaimRequest(holder=str(process), jobs=fleet.local_jobs(), process_id=process.pk)
    return _claim_repeating(Asked(wanted, now, ahead, using), limit).claims


def claim_run(
    run_id: int, holder: str, using: str = "default", *, now: datetime | None = None
) -> Claim | None:
    """Claim one run by id if it may start now, for a worker outside ``run_scheduler`` (a
    tasks backend's, ``holder`` naming it); None if it may not (already claimed, finished,
    cancelled, not due, its job not registered here) or was past its start deadline (then
    skipped). A run left for its job is enqueued again after ``TASKS_PICKUP_TIMEOUT``.

    ``now`` None means the database's clock; ``django_periodic.testing.run_due`` passes the
    time it runs at."""
    wanted = ClaimRequest(holder, fleet.local_jobs(), run_id=run_id, starts_at_once=True)
    claimed = _claim_repeating(Asked(wanted, now, None, using), 1).claims
    return claimed[0] if claimed else None


@dataclass(frozen=True)
class Asked:
    """What a claim asks, however many runs it takes: who asks and for which runs
    (``wanted``), at which clock (``now``; None: the database's, at the statement), how far
    ahead of it, on which database."""

    wanted: ClaimRequest
    now: datetime | None
    ahead: timedelta | None
    using: str

    def alone(self, run_id: int) -> Asked:
        """The same question, of one run."""
        return replace(self, wanted=replace(self.wanted, run_id=run_id))


def _claim_repeating(asked: Asked, limit: int) -> ClaimResult:
    """Claim up to ``limit`` runs; the result also names the schedules of the runs skipped
    as too late, or failed as impossible to claim."""
    if limit <= 0:
        return ClaimResult()
    using = asked.using
    result = batches.else_one_by_one(
        partial(_claim_at_once, asked, limit),
        partial(_claim_one_by_one, asked, limit),
        "A claim failed; claiming its runs one at a time.",
    )
    if result.claims and signals.listened(signals.run_started):
        announcements.send_on_commit(map(_started, result.claims), using)
    ended = result.late + result.refused
    promoted = ended and overlap.promote_queued(using, ended)
    if promoted and len(result.claims) < limit and asked.wanted.run_id is None:
        # A run skipped or failed made way for a queued one: it may start now too.
        more = _claim_repeating(asked, limit - len(result.claims))
        result.claims += more.claims
    return result


def _claim_at_once(asked: Asked, limit: int) -> ClaimResult:
    result = ledger(asked.using).claim(asked.wanted, asked.now, limit, asked.ahead)
    _announce(result, asked.using)
    return result


def _announce(result: ClaimResult, using: str) -> None:
    """The signals of the runs a claim skipped as too late, or failed."""
    overlap.announce_ended(result.late_runs, signals.run_skipped, using)
    overlap.announce_ended(result.refused_runs, signals.run_finished, using, duration=None)


def _claim_alone(asked: Asked) -> ClaimResult:
    with transaction.atomic(using=asked.using):
        return _claim_at_once(asked, 1)


def _claim_one_by_one(asked: Asked, limit: int) -> ClaimResult:
    """Claim the runs a failed claim would have taken, each alone; one that fails even
    alone ends ``failed`` (``cannot_claim``), with the error, and the others are claimed."""
    result = ClaimResult()
    using = asked.using
    runs = ledger(using).claimable(asked.wanted, asked.now or clock.now(using), asked.ahead)
    for run_id in runs.values_list("pk", flat=True)[:limit]:
        claimed = batches.refusal(partial(_claim_alone, asked.alone(run_id)))
        if isinstance(claimed, Exception):
            logger.error("Run %s cannot be claimed.", run_id, exc_info=claimed)
            message = f"Cannot claim: {type(claimed).__name__}: {error_text(claimed)}"
            result.refused += fail_unclaimed([run_id], ErrorCode.CANNOT_CLAIM, message, using)
        else:
            result += claimed
    return result


def fail_unclaimed(run_ids: list[int], code: str, message: str, using: str) -> list[int]:
    """Fail runs waiting to start (pending or retrying) that no worker can ever claim, with
    ``code`` and ``message``; return their schedules, whose queued runs may move up.

    One run's failure, never the process's: rare, so a few statements each time.
    """
    rows = ledger(using).fail_waiting(run_ids, code, message)
    result = ClaimResult(refused=[s for _, s in rows], refused_runs=[pk for pk, _ in rows])
    _announce(result, using)
    return result.refused


def _started(claim: Claim) -> signals.Event:
    run = claim.run
    return signals.of_run(
        signals.run_started, run, started_at=run.started_at, release_time=run.release_time
    )


def skip_late(now: datetime, using: str = "default") -> list[int]:
    """Skip pending fires no worker started before their start deadline (all were busy);
    return their schedules. A claim on PostgreSQL does this for the runs it picks."""
    result = ledger(using).skip_late(now)
    _announce(result, using)
    return result.late
