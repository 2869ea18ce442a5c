"""End to end: run_scheduler plans and enqueues, real workers execute: django-tasks-db's
``db_worker``, and ``celery worker`` through django-tasks-fennel (Redis as broker).

PostgreSQL only: real processes share the test database (see tests.processes).
"""

import os
import signal
from datetime import timedelta

import pytest

from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule
from tests import crash
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
# How far the schedulers' cursors may trail the moment planning is turned off.
PLANNING_SLACK = timedelta(seconds=5)
RAN_OR_SKIPPED = {"succeeded", "skipped"}
# Once every worker has run a job, the backlog of the workers' start (a fire per schedule)
# is worked off within a second; from then on at most this share of the fires is skipped.
STEADY_AFTER = timedelta(seconds=1)
SKIPPED_SHARE = 0.1


def test_three_schedulers_and_three_workers_run_every_handed_off_fire_once(
    children, worker_backend, tmp_path
):
    """20 schedules every second, planned by 3 ``--plan-only`` schedulers and run by 3
    workers that run a task at a time. Every plan time from the first fire until planning
    is turned off is a run, which ran once, by a worker, as its job noted (tests.jobs.note),
    or was skipped for overlap behind its schedule's previous run, still active when it
    was planned. Until every worker has started, the first fires wait for them and the
    next are skipped behind them; from a second after that, few are (SKIPPED_SHARE)."""
    notes = tmp_path / "notes.log"
    start = clock.now() + timedelta(seconds=3)
    for n in range(20):
        ScheduleFactory(
            name=f"every-second-{n}",
            job="tests.jobs.record",
            kwargs={"notes": str(notes)},
            interval=timedelta(seconds=1),
            start_at=start,
        )
    settings = {**SETTINGS, "TASKS_BACKEND": worker_backend}
    schedulers = [children.start("--plan-only", settings=settings) for _ in range(3)]
    workers = [children.start_worker(kind=TASK_WORKERS[worker_backend]) for _ in range(3)]
    worker_pids = {worker.pid for worker in workers}

    def every_worker_called() -> bool:
        calls = crash.read_notes(notes).values()
        return worker_pids <= {note.pid for same_attempt in calls for note in same_attempt}

    wait_for(every_worker_called, 90, "every worker to run a job", poll=0.2)
    steady = clock.now() + STEADY_AFTER
    ran = Execution.objects.filter(plan_time__gte=steady)
    wait_for(lambda: ran.count() >= 100, 60, "100 executions of later fires", poll=0.2)
    Schedule.objects.update(enabled=False)
    stopped_at = clock.now()
    wait_for(lambda: not Run.objects.active().exists(), 30, "the last runs to end")
    for scheduler in schedulers:
        assert scheduler.terminate() == 0, scheduler.output()
    # Every run has ended: the workers have nothing of ours left to do. How a worker exits
    # on SIGTERM is its own business (db_worker exits 1 inside its own COMMIT), not a
    # promise of ours, so they are killed rather than asked.
    for worker in workers:
        worker.kill()

    assert not Lease.objects.held().exists()  # nothing stuck

    ledger = crash.Ledger.load(notes)
    assert {run.tasks_backend for run in ledger.runs} == {worker_backend}
    crash.fail_if(ledger.duplicate_run_violations(), "one run row per (schedule, plan time)")
    crash.fail_if(
        ledger.missing_plan_time_violations(stopped_at, PLANNING_SLACK),
        "every plan time from the first fire until planning stopped is a run",
    )
    crash.fail_if(ledger.call_violations(), "every call noted was claimed and accounted for")
    crash.fail_if(ledger.success_violations(), "a success was called and left one row")
    crash.fail_if(ledger.at_most_once_violations(), "each fire called once")
    crash.fail_if(
        [f"{run.pk}: {run.status}" for run in ledger.runs if run.status not in RAN_OR_SKIPPED],
        "every fire ran or was skipped",
    )
    crash.fail_if(ledger.skip_violations(), "a fire is skipped only behind its active run")
    later = [run for run in ledger.runs if run.plan_time >= steady]
    skipped = [run for run in later if run.status == "skipped"]
    print(f"{len(skipped)} of {len(later)} fires skipped once every worker ran ({ledger.counts()})")
    assert len(skipped) <= SKIPPED_SHARE * len(later), ledger.counts()
    called_by = {note.pid for same_attempt in ledger.notes.values() for note in same_attempt}
    assert called_by == worker_pids


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
