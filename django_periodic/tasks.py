"""The task that executes a handed-off run on a tasks backend's worker (``handoff.py``
enqueues it).

The task claims the run's lease first, so a task delivered twice runs its job once, then
does what ``run_scheduler`` does for the runs its own workers hold: a watcher thread
heartbeats the lease, passes a cancel request on and enforces the timeout
(``engine/loop/watching.py``, the rule the scheduler's loop watches its runs by), and the
outcome is recorded under the lease's token. Importing this module needs Django's tasks
framework (``taskbackends.framework()``): only the hand-off imports it, when a run is
routed to a backend.
"""

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from django_periodic import taskbackends
from django_periodic.engine import tracing
from django_periodic.engine.loop import executor, watching, worker_connections
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.records import AttemptOutcome, Claim
from django_periodic.engine.runs import claims

logger = logging.getLogger("django_periodic")

# What the task returns when its run was not claimed (delivered twice, cancelled, done).
NOT_CLAIMED = "not claimed"
# What the task returns when the outcome was not recorded (its lease was lost meanwhile).
NOT_RECORDED = "not recorded"

# django.tasks' decorator (or the backport's): typed here, as the backport ships no stubs
# that mypy could see on every Django version.
task: Callable[..., Callable[[Callable[..., str]], Any]] = taskbackends.framework().task


@task()
def execute_run(
    run_id: int, using: str = "default", trace_context: dict[str, str] | None = None
) -> str:
    """Claim run ``run_id`` and execute its job under a lease, once however often the task is
    delivered; returns the run's new status, or why there was nothing to do.

    ``trace_context``: the dispatching scheduler's trace context (W3C ``traceparent``), sent
    only with ``OPENTELEMETRY`` on; the attempt's span links to it (docs/opentelemetry.md).
    """
    return execute(run_id, using, trace_context)


def execute_run_on(alias: str) -> Any:
    """``execute_run`` bound to backend ``alias``, built by that backend's own ``task_class``
    as ``@task(backend=alias)`` would build it: a backend may act as its tasks are built (a
    Celery-backed one registers each with Celery, under its module path)."""
    built = _built.get(alias)
    if built is None:
        task_class = taskbackends.framework().task_backends[alias].task_class
        if type(execute_run) is task_class:
            built = execute_run.using(backend=alias)
        else:
            values = {f.name: getattr(execute_run, f.name) for f in fields(execute_run) if f.init}
            built = task_class(**{**values, "backend": alias})
        _built[alias] = built
    return built


_built: dict[str, Any] = {}


@receiver(setting_changed)
def _forget_built(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKS":
        _built.clear()


def _register_with_every_backend() -> None:
    """Build the task for every backend of ``TASKS`` whose task class is its own: their
    workers import this module (Celery's autodiscovery does), and know the task only once it
    has been built there too."""
    backends = taskbackends.framework().task_backends
    for alias in taskbackends.aliases():
        try:
            if backends[alias].task_class is not type(execute_run):
                execute_run_on(alias)
        except Exception:  # a broken backend fails its own runs, not the others'
            logger.exception("Could not build the task for tasks backend %r.", alias)


_register_with_every_backend()


def execute(run_id: int, using: str = "default", origin: tracing.Carrier | None = None) -> str:
    """Claim the run and execute it, as ``run_scheduler``'s workers would; the run's new
    status, or why there was nothing to do."""
    # Outside the backend's own transaction, this thread's connections are ours to keep
    # clean for its next task; inside it, they are the backend's.
    ours = worker_connections.all_clean()
    claim = claims.claim_run(run_id, _holder(), using)
    if claim is None:
        return NOT_CLAIMED
    try:
        outcome = _run_watched(claim, origin)
    finally:
        if ours:
            # A worker's thread serves many tasks: its connection serves the next one
            # too (whatever CONN_MAX_AGE says), unless this job left it unfit.
            worker_connections.prepare_for_run()
    if outcome is None or not (outcome.recorded or executor.record([outcome])):
        return NOT_RECORDED
    return outcome.status


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()} (task)"


def _run_watched(claim: Claim, origin: tracing.Carrier | None) -> AttemptOutcome | None:
    """Call the job while the watcher heartbeats its lease and enforces cancel requests and
    its timeout; None if it was settled meanwhile (timed out, or its lease lost)."""
    stop = StopRequest()
    watch = watching.task_watcher().watch(claim, stop)
    try:
        outcome = executor.run_job(claim, stop, origin)
    finally:
        watch.finish()
    return None if watch.timed_out else outcome
