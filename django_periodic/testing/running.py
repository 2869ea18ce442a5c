"""``run_due()``: what ``run_scheduler --once`` would do at a given time, in this thread."""

import time
from datetime import datetime

from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.engine.loop import executor
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.planning import after, planner
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import admission, claims, outcomes
from django_periodic.models import Run

HOLDER = "django_periodic.testing.run_due"


class TooManyRuns(RuntimeError):
    """``run_due()`` executed ``max_runs`` runs and more were still runnable (a job that
    keeps recording runs of its own?)."""


def run_due(
    now: datetime | None = None,
    *,
    using: str = "default",
    handed_off: bool = True,
    max_runs: int = 1000,
) -> list[Run]:
    """Plan every fire due at ``now``, then execute every run that may start at ``now``
    (pending ones due, retries due) in this thread, until none is left; return the runs
    executed, in order, as they ended (``run.status``, ``run.result``, ``run.error_code``).

    Planning, claiming, calling and recording are the scheduler's own (``planner.plan_due``,
    ``claims.claim_run``, ``executor.run_job``, ``outcomes.record``), with a real lease per
    attempt: misfire and overlap policies, start deadlines, queued runs promoted when the
    active one ends (they run in the same call), all behave as in production. Async jobs
    are awaited. A run routed to a tasks backend is executed here too, as its task would
    (``handed_off=False`` leaves it alone).

    ``now`` (default: the database's clock) is the time everything happens at, however far
    from the database's clock: ``run_due(now=a_fire_time)`` plans that fire. Schedules
    first fire after the time they were saved (the database's clock); a ``now`` far past
    the cursor is downtime to the misfire policy (``latest`` fires once, the missed times
    are recorded skipped): to run each fire, call ``run_due`` at each in turn. A run's
    outcome is recorded at ``now`` plus the time its job took, so a retry is due after
    ``now``: call ``run_due(now=run.next_retry_at)`` to run it. Timeouts and cancel
    requests are not watched while a job runs here, and nothing heartbeats (a job's own
    ``context.heartbeat()`` works). A schedule that runs after others (``after``) gets its
    run as soon as theirs end, and runs in the same call; a run held by its concurrency limit
    runs once a slot frees, in the same call.
    """
    now = now or clock.now(using)
    _plan(now, using)
    after.plan_after(now, using)
    admission.admit(now, using)
    executed: dict[int, None] = {}  # run ids in the order they were executed
    progress = True
    while progress and (ids := _runnable(now, using, handed_off)):
        progress = False  # a pass that claims nothing ends the call: no endless loop
        for run_id in ids:
            if len(executed) >= max_runs:
                raise TooManyRuns(f"run_due() executed {max_runs} runs; more were runnable.")
            claim = claims.claim_run(run_id, HOLDER, using, now=now)
            if claim is None:
                continue  # skipped past its start deadline (or settled meanwhile)
            _execute(claim)
            progress = True
            executed.pop(run_id, None)
            executed[run_id] = None
        if progress:
            after.plan_after(now, using)  # the runs of schedules after those that ended
            admission.admit(now, using)  # into the slots of the runs that ended
    by_id = Run.objects.using(using).select_related("schedule").in_bulk(list(executed))
    return [by_id[run_id] for run_id in executed]


def _plan(now: datetime, using: str) -> None:
    batch_size = get_settings().PLAN_BATCH_SIZE
    while planner.plan_due(now, using=using, batch_size=batch_size).schedules >= batch_size:
        pass


def _runnable(now: datetime, using: str, handed_off: bool) -> list[int]:
    runs = Run.objects.using(using).claimable(now)
    if not handed_off:
        runs = runs.executed_here()
    return list(runs.values_list("pk", flat=True))


def _execute(claim: Claim) -> None:
    """Call the claimed job and record its outcome at the claim's clock (``now`` plus the
    time the job took), as a worker would."""
    outcome = executor.run_job(claim, StopRequest())
    if outcome is not None:
        ended_at = claim.db_time(time.monotonic())
        outcomes.record([outcome], ended_at, claim.using)
