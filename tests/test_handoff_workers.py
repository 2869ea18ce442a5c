"""End to end: run_scheduler plans and enqueues, real workers execute: django-tasks-db's
``db_worker``, and ``celery worker`` through django-tasks-fennel (Redis as broker).

PostgreSQL only: real processes share the test database (see tests.processes).
"""

import os
import signal
from collections import Counter
from datetime import timedelta

import pytest

from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule
from tests.factories import ScheduleFactory
from tests.models import Execution
from tests.processes import TASK_WORKERS, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True), pytest.mark.pgbouncer]

# Fast enough that a killed worker's lease is swept within about a second of expiring.
SETTINGS = {
    "TASKS_BACKEND": "database",
    "HEARTBEAT_INTERVAL": 0.25,
    "SWEEP_INTERVAL": 0.25,
    "POLL_INTERVAL": 0.5,
}
SKIPPED = {("skipped", "overlap"), ("skipped", "missed")}


def test_three_schedulers_and_three_workers_run_every_handed_off_fire_once(
    children, worker_backend
):
    start = clock.now() + timedelta(seconds=3)
    for n in range(20):
        ScheduleFactory(
            name=f"every-second-{n}",
            job="tests.jobs.record",
            interval=timedelta(seconds=1),
            start_at=start,
        )
    settings = {**SETTINGS, "TASKS_BACKEND": worker_backend}
    schedulers = [children.start("--plan-only", settings=settings) for _ in range(3)]
    workers = [children.start_worker(kind=TASK_WORKERS[worker_backend]) for _ in range(3)]
    wait_for(lambda: Execution.objects.count() >= 100, 90, "100 executions")
    Schedule.objects.update(enabled=False)
    wait_for(lambda: not Run.objects.active().exists(), 30, "the last runs to end")
    for scheduler in schedulers:
        assert scheduler.terminate() == 0, scheduler.output()
    # Every run has ended: the workers have nothing of ours left to do. How a worker exits
    # on SIGTERM is its own business (db_worker exits 1 inside its own COMMIT), not a
    # promise of ours, so they are killed rather than asked.
    for worker in workers:
        worker.kill()

    assert not Lease.objects.held().exists()  # nothing stuck

    runs = list(Run.objects.select_related("schedule"))
    assert {run.tasks_backend for run in runs} == {worker_backend}
    # On a loaded machine a worker may not start a fire within its second: the next fire is
    # then skipped by the overlap policy (or as missed), which is recorded, never lost.
    outcomes = Counter((run.status, run.error_code) for run in runs)
    assert set(outcomes) <= {("succeeded", ""), *SKIPPED}, outcomes
    executed = Counter(Execution.objects.values_list("schedule", "plan_time"))
    assert executed and set(executed.values()) == {1}  # each fire ran once
    succeeded = {(run.schedule.name, run.plan_time) for run in runs if run.status == "succeeded"}
    assert set(executed) == succeeded
    holders = set(Lease.objects.values_list("holder", flat=True))
    worker_pids = {str(worker.pid) for worker in workers}
    assert {holder.split(":")[1].split()[0] for holder in holders} <= worker_pids


@pytest.mark.parametrize("reentry", [False, True], ids=["at-most-once", "at-least-once"])
def test_a_sigkilled_worker_leaves_its_run_to_the_lease(postgres, children, reentry):
    schedule = ScheduleFactory(
        job="tests.jobs.linger",
        kwargs={"seconds": 1.5},
        # Twice the workers' heartbeat at the least (SETTINGS), so that under load the
        # rerun keeps its lease: only the killed worker's may expire.
        lease_timeout=timedelta(seconds=3),
        allow_stale_reentry=reentry,
        tasks_backend="database",
    )
    run = schedule.run_now()
    scheduler = children.start("--plan-only", settings=SETTINGS)
    doomed = children.start_worker(settings=SETTINGS)
    wait_for(Execution.objects.exists, 30, "the job to start")
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    if reentry:
        children.start_worker(settings=SETTINGS)  # takes the run's task once enqueued again
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "succeeded", 60, "the rerun")
    else:
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 60, "the sweep")
    assert scheduler.terminate() == 0, scheduler.output()

    run.refresh_from_db()
    first, *later = Lease.objects.filter(run=run).order_by("attempt")
    assert str(doomed.pid) in first.holder and first.outcome == "expired"
    assert run.interruptions == 1
    if reentry:
        assert (run.attempt, [lease.outcome for lease in later]) == (2, ["succeeded"])
        assert Execution.objects.count() == 2
    else:
        assert (run.attempt, run.error_code, later) == (1, "lease_expired", [])
        assert Execution.objects.count() == 1
