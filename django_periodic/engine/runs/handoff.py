"""Handing runs to a django.tasks backend: schedulers enqueue, the backend's workers execute
(``tasks.py``, the task and what it does on the worker).

A run routed to a backend (``Run.tasks_backend``, see ``conf.tasks_backend_for``) is never
claimed by ``run_scheduler``'s own workers. Once it may start, a scheduler marks it
enqueued (``enqueued_at``, at the database's clock) and, once that has committed, enqueues
one task for it. The worker that picks the task up claims the run's lease first
(``claims.claim_run``) and executes it as our own workers would: heartbeat, cancel,
timeout, token-guarded outcome, retries. A task delivered twice finds its run claimed
and does nothing. A task that nobody claimed within ``TASKS_PICKUP_TIMEOUT`` is presumed
lost and enqueued again, unless its backend says it is still waiting in the queue (for
at most three pickup timeouts).

A run fails alone: one routed to an alias the ``TASKS`` setting lacks ends ``failed``
(``unknown_tasks_backend``), and one whose task cannot be enqueued (the backend is down)
is left marked, to be enqueued again once the pickup timeout has passed.
"""

import logging
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Q

from django_periodic import taskbackends
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.engine import batches, overlap, tracing
from django_periodic.engine.runs import claims
from django_periodic.models import Run

logger = logging.getLogger("django_periodic")

# Runs marked and enqueued per transaction.
DISPATCH_BATCH = 500
# How many pickup timeouts a backend may say a task still waits before it is sent again.
STILL_QUEUED_PICKUP_TIMEOUTS = 3


def dispatch(using: str = "default") -> int:
    """Enqueue one task for each handed-off run that may start now and has no task
    waiting; return how many were enqueued. Several schedulers may dispatch at once: each
    marks the rows it locked, skipping those another holds."""
    enqueued = 0
    while True:
        with transaction.atomic(using=using):
            now = clock.now(using)
            batch = _take_batch(now, using)
        enqueued += _enqueue(batch, using)
        if len(batch) < DISPATCH_BATCH:
            return enqueued


def _take_batch(now: datetime, using: str) -> list[Run]:
    """Lock the next runs to enqueue and mark them enqueued at ``now``; those presumed
    lost that their backend still holds in its queue are marked but not returned."""
    runs = Run.objects.using(using)
    unsent = Q(enqueued_at__isnull=True)
    overdue = Q(enqueued_at__lte=now - get_settings().TASKS_PICKUP_TIMEOUT)
    waiting = runs.handed_off().claimable(now).filter(unsent | overdue)
    locked = waiting.select_for_update(skip_locked=True)
    locked = locked.only("pk", "schedule_id", "tasks_backend", "task_id")
    batch = list(locked[:DISPATCH_BATCH])
    if not batch:
        return []
    runs.filter(pk__in=[run.pk for run in batch]).update(enqueued_at=now)
    return [run for run in batch if not _still_queued(run, now)]


def _still_queued(run: Run, now: datetime) -> bool:
    """Whether the run's last task waits in its backend's queue, not picked up yet: the
    backend is busy, not lost. Without a result to ask for, presume it lost.

    A backend's word is taken for ``STILL_QUEUED_PICKUP_TIMEOUTS`` pickup timeouts after
    it took the task, no longer: Celery reports a task it lost (its worker killed after
    taking it) as waiting, for ever. Enqueued again, a task still waiting after all is only
    a second delivery, which claims nothing."""
    if not run.task_id:
        return False
    try:
        tasks = taskbackends.framework()
        backend = tasks.task_backends[run.tasks_backend]
        if not backend.supports_get_result:
            return False
        result = backend.get_result(run.task_id)
    except Exception:  # TaskResultDoesNotExist, a backend that lost it, one removed
        return False
    if result.status != tasks.TaskResultStatus.READY or result.enqueued_at is None:
        return False
    trusted = STILL_QUEUED_PICKUP_TIMEOUTS * get_settings().TASKS_PICKUP_TIMEOUT
    return bool(now - result.enqueued_at < trusted)


def _enqueue(batch: list[Run], using: str) -> int:
    """Enqueue the runs' tasks (after the commit that marked them) and note their ids."""
    if not batch:
        return 0
    unknown = _fail_unknown_backends(batch, using)
    runs = [run for run in batch if run.tasks_backend not in unknown]
    tracer = tracing.tracer
    if tracer is None or not runs:
        sent = _send(runs, using, None)
    else:
        with tracer.dispatching(len(runs)) as context:
            sent = _send(runs, using, context)
    _note_task_ids(sent, using)
    return len(sent)


def _send(runs: list[Run], using: str, context: tracing.Carrier | None) -> list[Run]:
    """Enqueue each run's task; the runs sent. With tracing on, each task carries the trace
    context of its dispatch, as a keyword that the previous release's task lacks: see
    docs/opentelemetry.md, "Rolling deploys" (upgrade the workers first)."""
    queue = get_settings().TASKS_QUEUE
    traced = {"trace_context": dict(context)} if context else {}
    sent = []
    for run in runs:
        try:
            run.task_id = _task(run.tasks_backend, queue).enqueue(run.pk, using, **traced).id
        except Exception:
            # Left marked: enqueued again once TASKS_PICKUP_TIMEOUT has passed.
            logger.exception("Could not enqueue run %s to %r.", run.pk, run.tasks_backend)
            continue
        sent.append(run)
    return sent


def _note_task_ids(sent: list[Run], using: str) -> None:
    """Store the ids of the tasks enqueued, in one statement; if the database refuses one
    (a backend's id longer than the column), the others one by one. A run whose id is
    not noted is executed all the same: only a lost task's check reads it."""
    batches.else_one_by_one(
        partial(_note, sent, using),
        partial(_note_one_by_one, sent, using),
        f"Could not note {len(sent)} task ids; noting them one at a time.",
    )


def _note(runs: list[Run], using: str) -> None:
    with transaction.atomic(using=using):
        Run.objects.using(using).bulk_update(runs, ["task_id"])


def _note_one_by_one(sent: list[Run], using: str) -> None:
    for run in sent:
        refused = batches.refusal(partial(_note, [run], using))
        if isinstance(refused, Exception):
            logger.error("Could not note task %r of run %s.", run.task_id, run.pk, exc_info=refused)


def _task(alias: str, queue: str) -> Any:
    """The task that executes a run, sent to backend ``alias``."""
    from django_periodic.tasks import execute_run_on  # imports the framework: only when used

    return execute_run_on(alias).using(queue_name=queue)


def _fail_unknown_backends(batch: list[Run], using: str) -> set[str]:
    """Fail the runs routed to an alias runs cannot be handed to (not in ``TASKS``, or no
    tasks framework): no task could ever execute them. Return those aliases."""
    errors = {alias: taskbackends.alias_error(alias) for alias in {r.tasks_backend for r in batch}}
    unknown = {alias: error for alias, error in errors.items() if error}
    schedules = []
    for alias, error in unknown.items():
        runs = [run.pk for run in batch if run.tasks_backend == alias]
        code = ErrorCode.UNKNOWN_TASKS_BACKEND
        schedules += claims.fail_unclaimed(runs, code, f"Cannot hand off: {error}", using)
    overlap.promote_queued(using, schedules)
    return set(unknown)
