"""Jobs the tests schedule. Autodiscovered, as any installed app's jobs.py is."""

import asyncio
import os
import time

from django_periodic import job
from tests.models import Execution

# A scheduler that is slow to load its jobs: tests stop it while it is still starting.
if slow_import := float(os.environ.get("PERIODIC_TEST_SLOW_IMPORT", 0)):
    print("tests.jobs: loading slowly", flush=True)
    time.sleep(slow_import)


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


@job
async def add_later(a: int, b: int) -> int:
    """Adds two numbers after yielding to the event loop once."""
    await asyncio.sleep(0)
    return a + b


@job(takes_context=True)
async def report_context_async(context):
    """Returns what its context says, heartbeating both ways from the event loop."""
    return {
        "heartbeat": context.heartbeat(),
        "aheartbeat": await context.aheartbeat(),
        "cancelled": context.cancelled,
    }


@job(takes_context=True)
async def linger_async(context, seconds: float = 30.0):
    """Writes an Execution row, then awaits ``seconds`` (cut short by a stop request)."""
    await Execution.objects.acreate(
        schedule=context.run.schedule.name,  # loaded with the claim: no query here
        plan_time=context.plan_time,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    await asyncio.sleep(seconds)
    return "finished"


@job
def raise_base_exception(name: str = "SystemExit"):
    """Raises SystemExit, KeyboardInterrupt or GeneratorExit, which are not Exceptions."""
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}.get(
        name, GeneratorExit
    )(f"{name} from a job")
