"""``call_job()``: one job called as a scheduler would, without a scheduler or a lease."""

import inspect
from collections.abc import Awaitable, Coroutine
from datetime import datetime
from typing import Any

from django_periodic import registry
from django_periodic.db import clock
from django_periodic.engine.loop import eventloop
from django_periodic.engine.loop.context import JobContext, StopRequest
from django_periodic.models import Run, Schedule


def call_job(job: str | Schedule, /, *args: Any, **kwargs: Any) -> Any:
    """Call a registered job by name (or a schedule's job) in this thread and return what
    it returns; its exception propagates. An async job is awaited on the event loop its
    scheduler would use.

    With a schedule and no arguments given, the schedule's ``args`` and ``kwargs`` are used.
    A job declared ``takes_context=True`` gets a real ``JobContext`` whose ``run`` is an
    *unsaved* ``Run`` (plan time: now, attempt 1; ``run.schedule`` is the schedule, if one
    was given): nothing is written to the database, ``heartbeat()`` is a no-op that
    returns True and ``cancelled`` is False. To test a job under a real lease, with its
    outcome recorded, save a run (``schedule.run_now()``) and use ``run_due()``.
    """
    if isinstance(job, Schedule):
        if not args and not kwargs:
            args, kwargs = tuple(job.args), dict(job.kwargs)
        run = Run.for_schedule(job, clock.wall_now(), args=list(args), kwargs=kwargs)
    else:
        run = Run(job_name=job, args=list(args), kwargs=kwargs, plan_time=clock.wall_now())
    run.attempt, run.status = 1, Run.Status.RUNNING
    found = registry.get_job(run.job_name)
    found.check_arguments(run.args, run.kwargs)
    if found.takes_context:
        args = (_context(run, run.plan_time), *args)
    result = found.func(*args, **kwargs)
    if inspect.isawaitable(result):
        return eventloop.submit(_awaited(result)).result()
    return result


def _context(run: Run, plan_time: datetime) -> JobContext:
    return JobContext(run, plan_time, run.attempt, lambda: True, StopRequest())


def _awaited(awaitable: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    async def wait() -> Any:
        return await awaitable

    return wait()
