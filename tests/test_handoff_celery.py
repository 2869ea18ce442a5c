"""End to end on Celery: run_scheduler plans and enqueues through django-tasks-fennel (a
django.tasks backend over Celery, Redis as broker), real ``celery worker`` processes execute.

PostgreSQL and Redis (scripts/test.sh starts both): real processes share the test database.
The SIGKILLed workers are in the crash suite (tests/test_crash.py).
"""

from collections import Counter
from datetime import timedelta

import pytest

from django_periodic import clock
from django_periodic.models import Lease, Run, Schedule
from tests.factories import ScheduleFactory
from tests.models import Execution
from tests.processes import CeleryWorkerProcess, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {
    "TASKS_BACKEND": "celery",
    "HEARTBEAT_INTERVAL": 0.25,
    "SWEEP_INTERVAL": 0.25,
    "POLL_INTERVAL": 0.5,
}
SKIPPED = {("skipped", "overlap"), ("skipped", "missed")}


def test_three_schedulers_and_three_celery_workers_run_every_fire_once(celery, children):
    start = clock.now() + timedelta(seconds=3)
    for n in range(20):
        ScheduleFactory(
            name=f"every-second-{n}",
            job="tests.jobs.record",
            interval=timedelta(seconds=1),
            start_at=start,
        )
    schedulers = [children.start(settings=SETTINGS) for _ in range(3)]
    workers = [children.start_worker(kind=CeleryWorkerProcess) for _ in range(3)]
    wait_for(lambda: Execution.objects.count() >= 100, 90, "100 executions")
    Schedule.objects.update(enabled=False)
    wait_for(lambda: not Run.objects.active().exists(), 30, "the last runs to end")
    for scheduler in schedulers:
        assert scheduler.terminate() == 0, scheduler.output()
    for worker in workers:
        assert worker.terminate() == 0, worker.output()  # Celery's warm shutdown

    assert not Lease.objects.held().exists()  # nothing stuck
    runs = list(Run.objects.select_related("schedule"))
    assert {run.tasks_backend for run in runs} == {"celery"}
    outcomes = Counter((run.status, run.error_code) for run in runs)
    assert set(outcomes) <= {("succeeded", ""), *SKIPPED}, outcomes
    assert len({(run.schedule_id, run.plan_time) for run in runs}) == len(runs)
    executed = Counter(Execution.objects.values_list("schedule", "plan_time"))
    assert executed and set(executed.values()) == {1}  # each fire ran once
    succeeded = {(run.schedule.name, run.plan_time) for run in runs if run.status == "succeeded"}
    assert set(executed) == succeeded
    holders = {
        holder.split(":")[1].split()[0] for holder in Lease.objects.values_list("holder", flat=True)
    }
    assert holders <= {str(worker.pid) for worker in workers}
