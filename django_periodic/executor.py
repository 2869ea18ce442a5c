"""Calling a claimed run's job: its context, its result, its error."""

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connections

from django_periodic import clock, leases, registry
from django_periodic.conf import get_settings
from django_periodic.models import Run

logger = logging.getLogger("django_periodic")


# How long a worker keeps trying to record an outcome while the database is away.
RECORD_RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15)


class StopRequest:
    """Why a running job should stop, set by its scheduler and read through its context."""

    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    TIMEOUT = "timeout"
    CANCEL = "cancel"

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


@dataclass
class JobContext:
    """What a job declared with ``takes_context=True`` receives as its first argument."""

    run: Run
    plan_time: datetime
    attempt: int
    _claim: leases.Claim = field(repr=False)
    _stop: StopRequest = field(default_factory=StopRequest, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the job should stop: it was cancelled or timed out, its lease was
        lost, or its scheduler is shutting down. A long job should check it and return."""
        return self._stop.is_set()

    def heartbeat(self) -> bool:
        """Extend this run's lease now; returns False once the job should stop."""
        if not leases.extend(self._claim, clock.now(self._claim.using)):
            self._stop.set(StopRequest.LEASE_LOST)
        return not self.cancelled


def execute(claim: leases.Claim, stop: StopRequest | None = None) -> str:
    """Run the claimed job to completion and record the outcome; return the run's status."""
    run = claim.run
    stop = stop or StopRequest()
    try:
        job = registry.get_job(run.job_name)
    except registry.UnknownJob as exc:
        return _record_failure(claim, leases.Failure("unknown_job", str(exc), retryable=False))
    context = JobContext(run, run.plan_time, run.attempt, claim, stop)
    args = [context, *run.args] if job.takes_context else list(run.args)
    try:
        result = job.func(*args, **run.kwargs)
    except Exception as exc:
        return _record_stop(claim, stop) or _record_failure(claim, _failure_of(exc))
    if stopped := _record_stop(claim, stop):
        return stopped
    if not _recorded(leases.succeed, claim, capped_result(result)):
        logger.warning("Run %s finished after losing its lease; result dropped.", run.pk)
        return "lost"
    return Run.Status.SUCCEEDED


def _recorded(record: Callable, claim: leases.Claim, *args) -> Any:
    """Call ``record(claim, now, *args)``, retrying while the database is unreachable.

    The token guard makes a repeat harmless if the first try did commit. Giving up leaves
    the run to its lease: the sweeper settles it once the lease expires.
    """
    for delay in RECORD_RETRY_DELAYS:
        try:
            return record(claim, clock.now(claim.using), *args)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("Could not record run %s (%s); retry in %s s.", claim.run.pk, exc, delay)
            connections[claim.using].close()
            time.sleep(delay)
    return record(claim, clock.now(claim.using), *args)


def _record_stop(claim: leases.Claim, stop: StopRequest) -> str | None:
    """A job that was cancelled or timed out ends so, however it returned; else None."""
    outcomes = {
        StopRequest.CANCEL: (leases.cancelled, Run.Status.CANCELLED),
        StopRequest.TIMEOUT: (leases.timed_out, Run.Status.FAILED),
    }
    if stop.reason not in outcomes:
        return None
    record, status = outcomes[stop.reason]
    return status if _recorded(record, claim) else "lost"


def _record_failure(claim: leases.Claim, failure: leases.Failure) -> str:
    run = claim.run
    status = _recorded(leases.fail, claim, failure)
    if status is None:
        logger.warning("Run %s failed after losing its lease; error dropped.", run.pk)
        return "lost"
    logger.warning("Run %s of %s %s: %s", run.pk, run.job_name, status, failure.message)
    return status


def _failure_of(exc: Exception) -> leases.Failure:
    limit = get_settings().ERROR_MAX_CHARS
    text = "".join(traceback.format_exception(exc))
    return leases.Failure(
        code=type(exc).__qualname__[:200],
        message=str(exc)[:limit],
        traceback=text[-limit:],  # the end of a traceback says where it broke
    )


def capped_result(result: Any) -> Any:
    """The result as stored: JSON as-is when it fits, else a truncated text preview."""
    limit = get_settings().RESULT_MAX_BYTES
    try:
        text = json.dumps(result, cls=DjangoJSONEncoder)
    except (TypeError, ValueError):
        return {"repr": repr(result)[:limit], "note": "result is not JSON-serializable"}
    if len(text.encode()) <= limit:
        return json.loads(text)
    return {"preview": text[:limit], "note": f"result truncated from {len(text)} characters"}
