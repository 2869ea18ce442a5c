"""Overlap, misfire, start deadline, timeout, cancel and wake-ups against real schedulers.

Time is driven by the database clock: schedules are made due in the near future or in the
past, and tests wait on run states with deadlines, never on sleeps.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count

from django_periodic.db import clock, postgresql
from django_periodic.engine.runs import leases
from django_periodic.models import Run, Schedule
from tests.factories import ScheduleFactory
from tests.helpers import set_cursor
from tests.models import Execution
from tests.processes import wait_for

pytestmark = pytest.mark.processes

FAST = {"TIMEOUT_GRACE": 1, "HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1}


def lingering(seconds: float, cooperative: bool = True, **fields) -> Schedule:
    return ScheduleFactory(
        job="tests.jobs.linger",
        kwargs={"seconds": seconds, "cooperative": cooperative},
        **fields,
    )


def every_second(seconds: float, **fields) -> Schedule:
    start = clock.now() + timedelta(seconds=1)
    return lingering(seconds, False, interval=timedelta(seconds=1), start_at=start, **fields)


def max_overlap(schedule: Schedule) -> int:
    """The most runs of ``schedule`` that were running at the same instant."""
    runs = Run.objects.filter(schedule=schedule, started_at__isnull=False)
    events = []
    for run in runs.exclude(finished_at=None):
        events += [(run.started_at, 1), (run.finished_at, -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):
        running += step
        peak = max(peak, running)
    return peak


def reasons(schedule: Schedule) -> dict[str, int]:
    rows = Run.objects.filter(schedule=schedule).values("status", "error_code")
    counts = rows.annotate(n=Count("pk"))
    return {f"{row['status']}:{row['error_code']}": row["n"] for row in counts}


def test_skip_never_overlaps_and_records_each_skipped_fire(children):
    schedule = every_second(2.5)
    children.start("--workers", "4")
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    wait_for(lambda: done.count() >= 2, 30, "two succeeded runs")
    assert reasons(schedule).get("skipped:overlap", 0) >= 2
    assert max_overlap(schedule) == 1


def test_queue_runs_fires_one_after_another_and_drops_beyond_the_bound(children):
    schedule = every_second(2.5, overlap="queue", max_queued=1)
    children.start("--workers", "4")
    waited = Run.objects.filter(schedule=schedule, status="succeeded", trigger="schedule")
    wait_for(lambda: waited.count() >= 3, 40, "three succeeded runs")
    assert reasons(schedule).get("skipped:queue_full", 0) >= 1
    assert max_overlap(schedule) == 1
    # A queued fire starts late, when the run before it ended, not at its plan time.
    lags = [run.started_at - run.plan_time for run in waited]
    assert max(lags) > timedelta(seconds=1)


def test_concurrent_runs_overlap_up_to_their_cap(children):
    schedule = every_second(3, overlap="concurrent", max_concurrent=2)
    children.start("--workers", "4")
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    wait_for(lambda: done.count() >= 3, 40, "three succeeded runs")
    assert max_overlap(schedule) == 2
    assert reasons(schedule).get("skipped:overlap", 0) >= 1


def downtime_schedule(start, misfire: str, **fields) -> Schedule:
    """A 2-minute schedule from ``start``, whose cursor has stayed there since."""
    schedule = ScheduleFactory(
        name=f"missed-{misfire}",
        job="tests.jobs.record",
        interval=timedelta(minutes=2),
        start_at=start,
        misfire=misfire,
        misfire_grace=timedelta(seconds=10),
        **fields,
    )
    set_cursor(schedule, start)
    return schedule


def plan_times(schedule: Schedule, **filters) -> list:
    runs = Run.objects.filter(schedule=schedule, **filters).order_by("plan_time")
    return list(runs.values_list("plan_time", flat=True))


def test_misfire_policies_after_downtime(children):
    # 11 plan times passed while no scheduler ran; the next is a minute away.
    start = clock.now() - timedelta(minutes=20, seconds=60)
    latest = downtime_schedule(start, "latest")
    every = downtime_schedule(start, "all", overlap="queue", max_queued=20)
    skip = downtime_schedule(start, "skip")
    missed = [start + timedelta(minutes=2 * k) for k in range(11)]
    child = children.start("--workers", "2")
    executed = Execution.objects.filter(schedule=every.name)
    wait_for(lambda: executed.count() == 11, 60, "every missed time of misfire=all to run")
    assert plan_times(latest, status="skipped", error_code="missed") == missed[:-1]
    wait_for(Run.objects.filter(schedule=latest, status="succeeded").exists, 30, "latest")
    assert plan_times(latest, status="succeeded") == missed[-1:]
    in_order = executed.order_by("executed_at").values_list("plan_time", flat=True)
    assert list(in_order) == missed
    assert plan_times(skip, status="skipped", error_code="missed") == missed
    assert plan_times(skip) == missed
    for schedule in (latest, every, skip):
        schedule.refresh_from_db()
        assert schedule.next_fire_at == missed[-1] + timedelta(minutes=2)
    assert child.terminate() == 0
    assert "Recovery done" in child.output()


def test_a_fire_no_worker_can_start_in_time_is_skipped(children):
    busy = lingering(30, cooperative=False, interval=timedelta(hours=1))
    busy.run_now()
    child = children.start("--workers", "1", settings=FAST)
    wait_for(Run.objects.filter(schedule=busy, status="running").exists, 30, "a busy worker")
    late = ScheduleFactory(interval=timedelta(seconds=1), misfire_grace=timedelta(seconds=1))
    skipped = Run.objects.filter(schedule=late, status="skipped", error_code="start_deadline")
    wait_for(skipped.exists, 30, "a fire skipped at its start deadline")
    assert not Run.objects.filter(schedule=late, started_at__isnull=False).exists()
    child.kill()


@pytest.mark.parametrize("cooperative", [True, False])
def test_a_run_past_its_timeout_fails_and_its_worker_is_replaced(children, cooperative):
    slow = lingering(60, cooperative, interval=timedelta(hours=1), timeout=timedelta(seconds=1))
    slow.run_now()
    child = children.start("--workers", "1", settings=FAST)
    failed = Run.objects.filter(schedule=slow, status="failed", error_code="timeout")
    wait_for(failed.exists, 30, "the run to time out")
    # The one worker slot is free again, even if the job body is still sleeping.
    quick = ScheduleFactory(job="tests.jobs.add", args=[1, 1], interval=timedelta(hours=1))
    quick.run_now()
    wait_for(Run.objects.filter(schedule=quick, status="succeeded").exists, 30, "a next run")
    assert child.terminate() == 0
    assert Run.objects.get(schedule=slow).status == "failed"  # a late finish changes nothing


@pytest.mark.parametrize("job", ["tests.jobs.linger", "tests.jobs.linger_async"])
def test_cancel_asks_a_running_job_to_stop(children, job):
    slow = ScheduleFactory(job=job, kwargs={"seconds": 60}, interval=timedelta(hours=1))
    slow.run_now()
    child = children.start("--workers", "1", settings=FAST)
    running = Run.objects.filter(schedule=slow, status="running")
    wait_for(running.exists, 30, "the run to start")
    wait_for(lambda: Execution.objects.filter(schedule=slow.name).exists(), 30, "the job body")
    assert leases.request_cancel(running, clock.now()) == (0, 1)
    wait_for(Run.objects.filter(schedule=slow, status="cancelled").exists, 30, "cancelled")
    assert child.terminate() == 0


def test_a_sleeping_scheduler_wakes_at_once_for_run_now(postgres, children):
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 1], interval=timedelta(hours=1))
    idle = {"POLL_INTERVAL": 600, "HEARTBEAT_INTERVAL": 300, "SWEEP_INTERVAL": 300}
    child = children.start("--workers", "1", settings=idle)
    wait_for(listening, 30, "the scheduler to LISTEN")
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    for count in (1, 2):  # the second request surely finds it asleep
        schedule.run_now()
        wait_for(lambda n=count: done.count() == n, 10, "the manual run, long before the poll")
    assert child.terminate() == 0


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            [f"LISTEN {postgresql.CHANNEL}"],
        )
        return cursor.fetchone()[0] == 1
