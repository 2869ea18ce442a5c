"""Calling a claimed run's job: its context, its result, its error."""

import json
import logging
import threading
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_periodic import clock, leases, registry
from django_periodic.conf import get_settings
from django_periodic.models import Run

logger = logging.getLogger("django_periodic")


@dataclass
class JobContext:
    """What a job declared with ``takes_context=True`` receives as its first argument."""

    run: Run
    plan_time: datetime
    attempt: int
    _claim: leases.Claim = field(repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the job should stop: its lease was lost or its scheduler is stopping."""
        return self._cancel.is_set()

    def heartbeat(self) -> bool:
        """Extend this run's lease now; returns False (and sets ``cancelled``) if it was lost."""
        if not leases.extend(self._claim, clock.now(self._claim.using)):
            self._cancel.set()
        return not self.cancelled


def execute(claim: leases.Claim, cancel: threading.Event | None = None) -> str:
    """Run the claimed job to completion and record the outcome; return the run's status."""
    run = claim.run
    try:
        job = registry.get_job(run.job_name)
    except registry.UnknownJob as exc:
        return _record_failure(claim, leases.Failure("unknown_job", str(exc), retryable=False))
    context = JobContext(run, run.plan_time, run.attempt, claim, cancel or threading.Event())
    args = [context, *run.args] if job.takes_context else list(run.args)
    try:
        result = job.func(*args, **run.kwargs)
    except Exception as exc:
        return _record_failure(claim, _failure_of(exc))
    if not leases.succeed(claim, clock.now(claim.using), capped_result(result)):
        logger.warning("Run %s finished after losing its lease; result dropped.", run.pk)
        return "lost"
    return Run.Status.SUCCEEDED


def _record_failure(claim: leases.Claim, failure: leases.Failure) -> str:
    run = claim.run
    status = leases.fail(claim, clock.now(claim.using), failure)
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
