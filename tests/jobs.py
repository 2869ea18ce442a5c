"""Jobs the tests schedule. Autodiscovered, as any installed app's jobs.py is."""

import os
import time

from django_periodic import job
from tests.models import Execution


@job
def noop(*args, **kwargs):
    """Does nothing and returns its arguments."""
    return {"args": list(args), "kwargs": kwargs}


@job
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@job
def explode(message: str = "boom"):
    """Always raises."""
    raise RuntimeError(message)


@job(takes_context=True)
def record(context, seconds: float = 0.0):
    """Writes an Execution row for its run, after sleeping ``seconds``."""
    if seconds:
        time.sleep(seconds)
    Execution.objects.create(
        schedule=context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    return context.attempt


@job(takes_context=True)
def report_context(context):
    """Returns what its context says."""
    return {
        "run": context.run.pk,
        "plan_time": context.plan_time.isoformat(),
        "attempt": context.attempt,
        "heartbeat": context.heartbeat(),
        "cancelled": context.cancelled,
    }


@job(takes_context=True)
def linger(context, seconds: float = 30.0, cooperative: bool = True):
    """Writes an Execution row, then waits ``seconds`` (less if cancelled and cooperative)."""
    Execution.objects.create(
        schedule=context.run.schedule.name,
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cooperative and context.cancelled:
            return "stopped"
        time.sleep(0.05)
    return "finished"
