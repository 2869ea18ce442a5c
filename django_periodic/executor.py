"""Calling a claimed run's job: its context, its result, its error."""

import asyncio
import contextlib
import inspect
import json
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connections

from django_periodic import clock, leases, registry
from django_periodic.conf import get_settings
from django_periodic.context import JobContext, StopRequest
from django_periodic.models import Run

logger = logging.getLogger("django_periodic")


# How long a worker keeps trying to record an outcome while the database is away.
RECORD_RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15)


def execute(claim: leases.Claim, stop: StopRequest | None = None) -> str | None:
    """Run the claimed job to completion and record the outcome.

    Returns the run's new status, or None when the outcome was not recorded because the
    lease was lost (or given up at shutdown): whoever holds the run now decides.
    """
    run = claim.run
    stop = stop or StopRequest()
    try:
        job = registry.get_job(run.job_name)
    except registry.UnknownJob as exc:
        return _record_failure(claim, leases.Failure("unknown_job", str(exc), retryable=False))
    context = JobContext(run, run.plan_time, run.attempt, _lease_extender(claim), stop)
    args = [context, *run.args] if job.takes_context else list(run.args)
    try:
        result = _call(job.func, args, run.kwargs, stop)
    except BaseException as exc:  # SystemExit too: it fails the run, not the worker
        stopped, status = _record_stop(claim, stop)
        if stopped:
            return status
        if isinstance(exc, asyncio.CancelledError) and stop.is_set():
            return None  # cancelled for a shutdown or a lost lease: not this worker's to record
        return _record_failure(claim, _failure_of(exc))
    stopped, status = _record_stop(claim, stop)
    if stopped:
        return status
    if not _recorded(leases.succeed, claim, capped_result(result)):
        logger.warning("Run %s finished after losing its lease; result dropped.", run.pk)
        return None
    return Run.Status.SUCCEEDED


def _lease_extender(claim: leases.Claim) -> Callable[[], bool]:
    return lambda: leases.extend(claim, clock.now(claim.using))


def _call(func: Callable[..., Any], args: list, kwargs: dict, stop: StopRequest) -> Any:
    """Call a job; an async one (or one returning an awaitable) runs on its own event loop."""
    result = func(*args, **kwargs)
    if inspect.isawaitable(result):
        return asyncio.run(_supervised(result, stop))
    return result


async def _supervised(awaitable: Awaitable[Any], stop: StopRequest) -> Any:
    """Await a job's awaitable; a stop request (timeout, cancel, shutdown) cancels it."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None

    def cancel() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to cancel
            loop.call_soon_threadsafe(task.cancel)

    stop.call_on_set(cancel)
    try:
        return await awaitable
    finally:
        stop.call_on_set(None)


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


# A job that was cancelled or timed out ends so, however it returned.
_STOP_OUTCOMES = {
    StopRequest.CANCEL: (leases.cancelled, Run.Status.CANCELLED),
    StopRequest.TIMEOUT: (leases.timed_out, Run.Status.FAILED),
}


def _record_stop(claim: leases.Claim, stop: StopRequest) -> tuple[bool, str | None]:
    """Record the end of a cancelled or timed-out job: (whether it was one, its status)."""
    if stop.reason not in _STOP_OUTCOMES:
        return False, None
    record, status = _STOP_OUTCOMES[stop.reason]
    return True, (status if _recorded(record, claim) else None)


def _record_failure(claim: leases.Claim, failure: leases.Failure) -> str | None:
    run = claim.run
    status = _recorded(leases.fail, claim, failure)
    if status is None:
        logger.warning("Run %s failed after losing its lease; error dropped.", run.pk)
        return None
    logger.warning("Run %s of %s %s: %s", run.pk, run.job_name, status, failure.message)
    return status


def _failure_of(exc: BaseException) -> leases.Failure:
    """The recorded failure of a job's exception. Only an ``Exception`` is retried: a job
    raising SystemExit or KeyboardInterrupt asked to stop, not to be run again."""
    limit = get_settings().ERROR_MAX_CHARS
    text = "".join(traceback.format_exception(exc))
    return leases.Failure(
        code=type(exc).__qualname__[:200],
        message=str(exc)[:limit],
        traceback=text[-limit:],  # the end of a traceback says where it broke
        retryable=isinstance(exc, Exception),
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
