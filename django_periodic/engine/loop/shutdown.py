"""A scheduler process's stop: running jobs get the grace (a second stop signal ends it),
runs not started go back at once, what is left is released, and the process unregisters.

The loop (scheduler.py) calls this once, whether it stopped on a signal or, with
``--once``, when what was due is done.
"""

import logging
from typing import Protocol

from django_periodic.conf import PeriodicSettings
from django_periodic.db import clock
from django_periodic.engine import records
from django_periodic.engine.loop import executor
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.housekeeping import Housekeeper
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.stop_signals import StopSignals
from django_periodic.engine.loop.wakeups import Listener
from django_periodic.engine.loop.workers import Claimer, WorkerPool
from django_periodic.engine.runs import outcomes
from django_periodic.models import SchedulerProcess

logger = logging.getLogger("django_periodic")


class Scheduler(Protocol):
    """What a stop needs of the scheduler (``scheduler.Scheduler``)."""

    using: str
    settings: PeriodicSettings
    process: SchedulerProcess | None
    stop: StopSignals
    recorder: Recorder
    pool: WorkerPool | None
    claimer: Claimer | None
    listener: Listener
    housekeeper: Housekeeper


def shut_down(scheduler: Scheduler) -> None:
    """Let running jobs finish within the grace, release what is left, unregister."""
    if scheduler.claimer:
        scheduler.claimer.stop()  # no claim after the unstarted runs go back
    if scheduler.pool:
        running = len(scheduler.pool.in_flight())
        logger.info(
            "Stopping: %d running jobs get up to %s to finish (a second signal stops waiting).",
            running,
            scheduler.settings.SHUTDOWN_GRACE,
        )
        _drain(scheduler)
        scheduler.pool.stop()
    scheduler.recorder.stop(timeout=executor.RECORD_PATIENCE)
    # Last: its connection holds this process's session lock, which says to the others
    # that it is alive (presence.py) while it finishes and records its runs.
    scheduler.listener.stop()
    if scheduler.process:
        SchedulerProcess.objects.using(scheduler.using).filter(pk=scheduler.process.pk).delete()
        logger.info("Scheduler %s stopped.", scheduler.process)


def _drain(scheduler: Scheduler) -> None:
    """Wait out the grace for running jobs (a second stop signal ends it), then release."""
    pool, using, settings, stop = (
        scheduler.pool,
        scheduler.using,
        scheduler.settings,
        scheduler.stop,
    )
    assert pool is not None
    # Runs not started yet go back at once, for another process to start on time.
    unstarted = pool.withdraw_unstarted()
    _give_up([outcomes.unstarted(claim) for claim in unstarted], "not started", using)
    now = clock.now(using)
    deadline = now + settings.SHUTDOWN_GRACE
    while now < deadline and not pool.idle() and not stop.hurried:
        stop.alarm.wait(min(settings.HEARTBEAT_INTERVAL, deadline - now).total_seconds())
        now = clock.now(using)
        if now >= scheduler.housekeeper.next_heartbeat:
            scheduler.housekeeper.heartbeat(scheduler.process, now)
    if stop.hurried:
        logger.warning("Second stop signal: giving up the running jobs now.")
    # Taken before the jobs are told: one that ends at once still gets released here.
    # All started: runs not started were withdrawn above, and none is claimed since.
    unfinished = pool.in_flight()
    pool.stop_all(StopRequest.SHUTDOWN)
    released = [outcomes.released(claim) for claim in unfinished]
    outcomes.announce_released(released, _give_up(released, "unfinished", using))


def _give_up(given_up: list[records.AttemptOutcome], state: str, using: str) -> set[int]:
    recorded = outcomes.record(given_up, using=using) if given_up else set()
    for run_id in recorded:
        logger.warning("Gave up run %s %s at shutdown.", run_id, state)
    return recorded
