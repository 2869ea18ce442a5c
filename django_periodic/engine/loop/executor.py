"""Calling a claimed run's job: its context, its result, its error."""

import asyncio
import contextlib
import inspect
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from django_periodic import registry
from django_periodic.choices import WARNING_STATUSES, ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import CONNECTION_ERRORS, clock
from django_periodic.engine import records, tracing
from django_periodic.engine.loop import eventloop, worker_connections
from django_periodic.engine.loop.context import JobContext, StopRequest
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import atomic, leases, outcomes
from django_periodic.error_texts import error_text, shown, traceback_text
from django_periodic.escaping import escaped

logger = logging.getLogger("django_periodic")


# How long the recorder keeps trying to record outcomes while the database is away.
RECORD_RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15)
RECORD_PATIENCE = sum(RECORD_RETRY_DELAYS) + 5.0


def run_job(
    claim: Claim, stop: StopRequest, origin: tracing.Carrier | None = None
) -> records.AttemptOutcome | None:
    """Call the claimed run's job and decide its outcome (recording is the caller's).

    An async job is awaited on the process's event loop while this thread waits. None means
    there is nothing for this worker to record: an async job cancelled for a shutdown or a
    lost lease, whose run its scheduler gives up (or already lost). ``origin``: the trace
    context a handed-off run's task carried (``tracing.py``).
    """
    called = call_job(claim, stop, origin)
    if isinstance(called, AsyncRun):
        return called.ended(eventloop.submit(called.outcome()))
    return called


def call_job(
    claim: Claim, stop: StopRequest, origin: tracing.Carrier | None = None
) -> "records.AttemptOutcome | AsyncRun | None":
    """Call the claimed run's job: the outcome of a sync job, or the ``AsyncRun`` still to
    await of an async one (a job that returned an awaitable)."""
    if stop.is_set():  # before it started: cancelled, timed out, or lost, never run
        stopped = _STOP_OUTCOMES.get(stop.reason)
        return stopped(claim) if stopped else None
    started_at = claim.db_time(time.monotonic())
    if claim.too_late(started_at):
        return outcomes.skipped_late(claim)
    tracer = tracing.tracer
    if tracer is None:
        return _call(claim, stop, started_at)
    span = tracer.run(claim, started_at, origin)
    with span.current():
        called = _call(claim, stop, started_at)
    if isinstance(called, AsyncRun):
        return replace(called, span=span)  # it ends when the job has been awaited
    span.end(called)
    return called


def _call(
    claim: Claim, stop: StopRequest, started_at: datetime | None
) -> "records.AttemptOutcome | AsyncRun | None":
    run = claim.values
    try:
        job = registry.get_job(run.job_name)
    except registry.UnknownJob as exc:
        failure = records.Failure(ErrorCode.UNKNOWN_JOB, str(exc), retryable=False)
        return outcomes.failed(claim, failure).started(started_at)
    # The run's model instance is built only if the job reads it (``Claim.run``).
    extend = _lease_extender(claim, job)
    context = JobContext(lambda: claim.run, run.plan_time, run.attempt, extend, stop)
    args = [context, *run.args] if job.takes_context else list(run.args)
    if job.atomic:
        return atomic.call(
            claim,
            lambda: job.func(*args, **run.kwargs),
            lambda result, error: _outcome_of(claim, stop, started_at, result, error=error),
        )
    try:
        result = job.func(*args, **run.kwargs)
    except BaseException as exc:  # SystemExit too: it fails the run, not the worker
        return _outcome_of(claim, stop, started_at, error=exc)
    if inspect.isawaitable(result):
        return AsyncRun(claim, stop, started_at, result)
    return _outcome_of(claim, stop, started_at, result)


@dataclass(frozen=True)
class AsyncRun:
    """An async job's run, called but not yet awaited.

    ``outcome()`` is the coroutine to await on the event loop: it ends with the run's
    outcome, whatever the job does. ``ended()`` reads that outcome from its future.
    """

    claim: Claim
    stop: StopRequest
    started_at: datetime | None
    awaitable: Awaitable[Any]
    span: tracing.RunSpan | None = None  # its trace, with tracing on

    async def outcome(self) -> records.AttemptOutcome | None:
        """Await the job; a stop request (timeout, cancel, shutdown) cancels it."""
        if self.span is None:
            return await self._outcome()
        with self.span.current():  # in the task that awaits the job: its spans are children
            return await self._outcome()

    async def _outcome(self) -> records.AttemptOutcome | None:
        try:
            # A connection the server closed while idle (a restart) is replaced first.
            await sync_to_async(worker_connections.prepare_for_run)()
            result = await _supervised(self.awaitable, self.stop)
        except BaseException as exc:
            # Caught here, in the task: a SystemExit escaping a task stops the whole loop.
            return _outcome_of(self.claim, self.stop, self.started_at, error=exc)
        finally:
            # The ORM's async methods query on asgiref's one thread: its connection serves
            # the next async run too, unless this job left it unfit. A stop request's
            # cancel arriving meanwhile has nothing left to cancel.
            with contextlib.suppress(asyncio.CancelledError):
                await sync_to_async(worker_connections.prepare_for_run)()
        return _outcome_of(self.claim, self.stop, self.started_at, result)

    def ended(
        self, future: "Future[records.AttemptOutcome | None]"
    ) -> records.AttemptOutcome | None:
        """The outcome from ``outcome()``'s future, waiting for it if need be. A run whose
        coroutine never ended (its loop stopped first) is given up, as at a shutdown."""
        try:
            outcome = future.result()
        except Exception:
            logger.exception("Run %s: its event loop ended before its job.", self.claim.values.pk)
            outcome = outcomes.released(self.claim, _LOOP_ENDED).started(self.started_at)
        if self.span is not None:
            self.span.end(outcome)
        return outcome


_LOOP_ENDED = "Its event loop ended before the job finished; not run again."


def _outcome_of(
    claim: Claim,
    stop: StopRequest,
    started_at: datetime | None,
    result: Any = None,
    *,
    error: BaseException | None = None,
) -> records.AttemptOutcome | None:
    """The outcome of a job that returned ``result`` or raised ``error``."""
    if stop.reason in _STOP_OUTCOMES:
        return _STOP_OUTCOMES[stop.reason](claim).started(started_at)
    if error is None:
        return outcomes.succeeded(claim, result, started_at)
    if isinstance(error, asyncio.CancelledError) and stop.is_set():
        return None
    return outcomes.failed(claim, _failure_of(error)).started(started_at)


# A job that was cancelled or timed out ends so, however it returned.
_STOP_OUTCOMES = {StopRequest.CANCEL: outcomes.cancelled, StopRequest.TIMEOUT: outcomes.timed_out}


def record(batch: list[records.AttemptOutcome]) -> set[int]:
    """Record outcomes of one database, retrying while it is unreachable; the ids recorded.

    The token guard makes a repeat harmless if a first try did commit. Giving up leaves
    the runs to their leases: the sweeper settles them once the leases expire.
    """
    using = batch[0].claim.using
    for delay in (*RECORD_RETRY_DELAYS, None):
        try:
            recorded = outcomes.record(batch, None, using)
            break
        except CONNECTION_ERRORS as exc:
            if delay is None:
                raise
            logger.warning(
                "Could not record %d outcomes (%s); retry in %s s.", len(batch), shown(exc), delay
            )
            connections[using].close()
            time.sleep(delay)
    for outcome in batch:
        _log(outcome, outcome.claim.values.pk in recorded)
    return recorded


def _log(outcome: records.AttemptOutcome, recorded: bool) -> None:
    run = outcome.claim.values
    if not recorded:
        logger.warning("Run %s ended after losing its lease; outcome dropped.", run.pk)
    elif outcome.status in WARNING_STATUSES:
        logger.warning(
            "Run %s of %s %s: %s",
            run.pk,
            escaped(run.job_name),
            outcome.status,
            escaped(outcome.error_message),
        )


def timeout_at(claim: Claim) -> datetime | None:
    """When the claimed run overruns its schedule's timeout (None: it has none)."""
    timeout, started_at = claim.values.timeout, claim.values.started_at
    return None if timeout is None or started_at is None else started_at + timeout


def next_watch_at(claim: Claim, now: datetime) -> datetime | None:
    """When the run next needs watching for its timeout: the timeout, or once past it the
    end of its grace (None: it has no timeout)."""
    deadline = timeout_at(claim)
    if deadline is None:
        return None
    return deadline if now < deadline else deadline + get_settings().TIMEOUT_GRACE


def watch(claim: Claim, stop: StopRequest, now: datetime, cancel_asked: bool) -> bool:
    """Enforce what a running job must obey at ``now``: a cancel request, its timeout (told
    to stop), and the grace after it (failed ``timeout``, whatever the job does later).

    Returns True when the run was failed as timed out: its thread is given up.
    """
    if cancel_asked:
        stop.set(StopRequest.CANCEL)
    deadline = timeout_at(claim)
    if deadline is None or now < deadline:
        return False
    stop.set(StopRequest.TIMEOUT)
    if now < deadline + get_settings().TIMEOUT_GRACE or not leases.timed_out(claim, now):
        return False
    logger.error("Run %s timed out; its worker thread is given up.", claim.values.pk)
    return True


def _lease_extender(claim: Claim, job: registry.Job) -> Callable[[], bool]:
    if job.atomic:
        # Inside its transaction, an UPDATE would lock the lease until the job's commit and
        # hide the extension from the others: its process's heartbeat extends it instead.
        return lambda: leases.still_held(claim)
    return lambda: leases.extend(claim, clock.now(claim.using))


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


def _failure_of(exc: BaseException) -> records.Failure:
    """The failure of a job's exception, its texts in full (``outcomes.failed`` caps them)
    but for the row values a database error quotes (``error_texts.py``). Only an
    ``Exception`` is retried: a job raising SystemExit or KeyboardInterrupt asked to stop,
    not to be run again."""
    return records.Failure(
        code=type(exc).__qualname__,
        message=error_text(exc),
        traceback=traceback_text(exc) or "".join(traceback.format_exception(exc)),
        retryable=isinstance(exc, Exception),
    )
