"""One outcome at a time, as tests drive the ledger: the engine records outcomes in
batches (``outcomes.record``) and never needs these."""

from datetime import datetime
from typing import Any

from django_periodic.engine import records
from django_periodic.engine.loop import executor
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import outcomes


def succeed(claim: Claim, now: datetime | None, result: Any) -> bool:
    """Record the run's result; False if the lease was lost (the result is then dropped)."""
    return outcomes.record_one(outcomes.succeeded(claim, result), now)


def fail(claim: Claim, now: datetime | None, failure: records.Failure) -> str | None:
    """Record a failed attempt (retried while attempts remain); the run's new status, or
    None if the lease was lost."""
    outcome = outcomes.failed(claim, failure)
    return outcome.status if outcomes.record_one(outcome, now) else None


def release(claim: Claim, now: datetime | None) -> bool:
    """Give up an unfinished run, as at shutdown (``outcomes.released``)."""
    return outcomes.record_one(outcomes.released(claim), now)


def execute(claim: Claim, stop: StopRequest | None = None) -> str | None:
    """Run the claimed job to completion and record its outcome: the run's new status, or
    None when nothing was recorded (the lease was lost, or given up at shutdown)."""
    outcome = executor.run_job(claim, stop or StopRequest())
    if outcome is None or not (outcome.recorded or executor.record([outcome])):
        return None
    return outcome.status
