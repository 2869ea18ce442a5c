import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_periodic import signals, taskbackends
from django_periodic.db import clock
from django_periodic.engine.planning import backfill, planner
from django_periodic.engine.runs import handoff, leases
from django_periodic.models import Lease, Run
from django_periodic.operations import health
from django_periodic.testing import fire_times, run_due
from tests.factories import RunFactory, ScheduleFactory
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread

EVERY_10 = "*/10 * * * *"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)  # the backfills' database clock, injected


def cron_schedule(**fields):
    return ScheduleFactory(**{"cron": EVERY_10, "interval": None, "timezone": "UTC", **fields})


def in_threads(*work):
    """Run each callable in its own thread (and connection), all released at once; raise
    the first error one of them met."""
    barrier = threading.Barrier(len(work))
    errors = []

    def run(function):
        try:
            barrier.wait()
            function()
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [Thread(target=run, args=(function,)) for function in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def backfilled(schedule):
    runs = Run.objects.filter(schedule=schedule, trigger=Run.Trigger.BACKFILL)
    return list(runs.order_by("plan_time", "scope"))


@pytest.mark.django_db
def test_backfill_records_one_waiting_run_per_plan_time_in_the_range():
    schedule = cron_schedule(job="tests.jobs.add", args=[1, 2])
    result = schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    runs = backfilled(schedule)
    assert [run.plan_time for run in runs] == fire_times(EVERY_10, T0, T0 + timedelta(minutes=30))
    assert {(run.status, run.attempt, run.job_name, run.schedule_revision) for run in runs} == {
        ("retrying", 0, "tests.jobs.add", schedule.revision)
    }
    assert (result.recorded, result.existing, result.start) == (3, 0, T0)


@pytest.mark.django_db
def test_backfill_does_not_move_the_cursor():
    schedule = cron_schedule()
    cursor = schedule.next_fire_at
    schedule.backfill(T0, NOW, now=NOW)
    schedule.refresh_from_db()
    assert schedule.next_fire_at == cursor


@pytest.mark.django_db
def test_backfill_skips_plan_times_that_have_a_run_of_any_trigger():
    schedule = cron_schedule()
    RunFactory(schedule=schedule, plan_time=T0, status=Run.Status.SUCCEEDED)
    RunFactory(schedule=schedule, plan_time=T0 + timedelta(minutes=10), trigger="manual")
    result = schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    assert [run.plan_time for run in backfilled(schedule)] == [T0 + timedelta(minutes=20)]
    assert (result.recorded, result.existing, result.plan_times) == (1, 2, 3)


@pytest.mark.django_db
def test_backfilling_a_range_twice_records_nothing_the_second_time():
    schedule = cron_schedule()
    schedule.backfill(T0, NOW, now=NOW)
    again = schedule.backfill(T0, NOW, now=NOW)
    assert (again.recorded, again.existing) == (0, 6)
    assert len(backfilled(schedule)) == 6


@pytest.mark.django_db
def test_backfill_clamps_the_end_to_now_and_records_no_future_plan_time():
    schedule = cron_schedule()
    result = schedule.backfill(NOW - timedelta(minutes=15), NOW + timedelta(days=1), now=NOW)
    assert result.end == NOW
    assert [run.plan_time for run in backfilled(schedule)] == [NOW - timedelta(minutes=10)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (NOW + timedelta(minutes=1), NOW + timedelta(hours=1), "in the future"),
        (T0, T0, "must come before end"),
        (T0.replace(tzinfo=None), NOW, "aware"),
    ],
)
def test_backfill_refuses_a_bad_range(start, end, message):
    schedule = cron_schedule()
    with pytest.raises(ValueError, match=message):
        schedule.backfill(start, end, now=NOW)
    assert not backfilled(schedule)


@pytest.mark.django_db
def test_backfill_refuses_more_runs_than_the_limit_and_records_none():
    schedule = cron_schedule(cron="* * * * *")
    start = NOW - timedelta(minutes=backfill.MAX_RUNS + 1)
    with pytest.raises(ValueError, match=f"limit per call is {backfill.MAX_RUNS}"):
        schedule.backfill(start, NOW, now=NOW)
    assert not backfilled(schedule)


@pytest.mark.django_db
def test_backfill_of_exactly_the_limit_is_recorded():
    schedule = cron_schedule(cron="* * * * *")
    start = NOW - timedelta(minutes=backfill.MAX_RUNS)
    assert schedule.backfill(start, NOW, now=NOW, rate=1000).recorded == backfill.MAX_RUNS


@pytest.mark.django_db
def test_backfill_refuses_a_rate_that_is_not_positive():
    schedule = cron_schedule()
    with pytest.raises(ValueError, match="rate must be a positive number"):
        schedule.backfill(T0, NOW, now=NOW, rate=0)


@pytest.mark.django_db
def test_backfill_respects_the_schedules_start_and_end():
    schedule = cron_schedule(start_at=T0 + timedelta(minutes=15), end_at=T0 + timedelta(minutes=35))
    schedule.backfill(T0, NOW, now=NOW)
    assert [run.plan_time for run in backfilled(schedule)] == [
        T0 + timedelta(minutes=20),
        T0 + timedelta(minutes=30),
    ]


@pytest.mark.django_db
def test_backfill_of_a_fanned_out_schedule_records_one_run_per_scope_key():
    schedule = cron_schedule(job="tests.jobs.per_tenant", scopes="tests.regions")
    result = schedule.backfill(T0, T0 + timedelta(minutes=20), now=NOW)
    keys = [(run.plan_time, run.scope) for run in backfilled(schedule)]
    assert keys == [(t, scope) for t in (T0, T0 + timedelta(minutes=10)) for scope in ("eu", "us")]
    assert result.recorded == 4


@pytest.mark.django_db
def test_backfilled_runs_are_released_at_most_rate_per_second_from_now():
    schedule = cron_schedule()
    result = schedule.backfill(T0, NOW, now=NOW, rate=2)
    releases = [run.next_retry_at for run in backfilled(schedule)]
    assert releases == [NOW + i * timedelta(seconds=0.5) for i in range(6)]
    assert (result.first_release, result.last_release) == (releases[0], releases[-1])


@pytest.mark.django_db
def test_a_second_backfill_is_released_after_the_runs_still_waiting():
    schedule = cron_schedule()
    schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    later = NOW + timedelta(seconds=1)
    result = schedule.backfill(T0 + timedelta(minutes=30), NOW, now=later)
    assert result.first_release == NOW + timedelta(seconds=3)  # after NOW, +1 s, +2 s


@pytest.mark.django_db
def test_backfilled_runs_execute_when_released_not_before():
    schedule = cron_schedule(job="tests.jobs.add", args=[1, 2])
    schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    first = run_due(now=NOW)
    assert [run.plan_time for run in first] == [T0]
    rest = run_due(now=NOW + timedelta(seconds=2))
    assert [run.plan_time for run in rest] == [
        T0 + timedelta(minutes=10),
        T0 + timedelta(minutes=20),
    ]
    assert {run.status for run in backfilled(schedule)} == {"succeeded"}


@pytest.mark.django_db
def test_a_new_fire_does_not_supersede_backfilled_runs_waiting_for_release():
    schedule = cron_schedule(overlap="concurrent")
    schedule.backfill(T0, NOW, now=NOW, rate=0.001)
    due = schedule.next_fire_at
    planner.plan_due(due)
    assert {run.status for run in backfilled(schedule)} == {"retrying"}
    assert Run.objects.get(schedule=schedule, trigger="schedule").status == "pending"


@pytest.mark.django_db
def test_the_planner_does_not_fire_again_a_plan_time_that_was_backfilled():
    schedule = cron_schedule(misfire="all", overlap="concurrent")
    schedule.next_fire_at = T0
    schedule.save(update_fields=["next_fire_at"])
    schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    planner.plan_due(T0 + timedelta(minutes=45))
    plan_times = list(Run.objects.filter(schedule=schedule).values_list("plan_time", "trigger"))
    assert sorted(plan_times) == [
        (T0, "backfill"),
        (T0 + timedelta(minutes=10), "backfill"),
        (T0 + timedelta(minutes=20), "backfill"),
        (T0 + timedelta(minutes=30), "schedule"),
        (T0 + timedelta(minutes=40), "schedule"),
    ]


@pytest.mark.django_db(transaction=True)
def test_concurrent_backfills_never_record_a_plan_time_twice(postgres):
    schedule = cron_schedule(cron="* * * * *")
    start = NOW - timedelta(minutes=300)
    results = []

    def backfill_from(minutes):  # overlapping ranges, each from a different start
        begin = start + timedelta(minutes=minutes)
        return lambda: results.append(schedule.backfill(begin, NOW, now=NOW, rate=1000))

    in_threads(*(backfill_from(i * 7) for i in range(4)))
    plan_times = [run.plan_time for run in backfilled(schedule)]
    assert plan_times == fire_times("* * * * *", start, NOW)
    assert sum(result.recorded for result in results) == 300


@pytest.mark.django_db(transaction=True)
def test_a_backfill_racing_the_planner_never_records_a_plan_time_twice(postgres):
    start = NOW - timedelta(minutes=50)
    schedules = [
        cron_schedule(cron="* * * * *", misfire="all", overlap="concurrent") for _ in range(2)
    ]
    for schedule in schedules:
        schedule.next_fire_at = start
        schedule.save(update_fields=["next_fire_at"])
    work = [lambda s=s: s.backfill(start, NOW, now=NOW, rate=1000) for s in schedules]
    in_threads(*work, lambda: planner.plan_due(NOW - timedelta(seconds=1)))
    for schedule in schedules:
        runs = Run.objects.filter(schedule=schedule)
        plan_times = sorted(runs.values_list("plan_time", flat=True))
        assert plan_times == fire_times("* * * * *", start, NOW)


@pytest.mark.django_db(transaction=True)
def test_a_real_scheduler_executes_released_backfilled_runs():
    schedule = cron_schedule(job="tests.jobs.record")
    now = clock.now()
    result = schedule.backfill(now - timedelta(minutes=30), now, rate=100)
    wait_for(lambda: clock.now() >= result.last_release, 10, "the last release")
    call_command("run_scheduler", "--once", workers=2, verbosity=0)
    assert {run.status for run in backfilled(schedule)} == {"succeeded"}
    assert len(backfilled(schedule)) == 3


@pytest.mark.django_db
def test_a_backfilled_run_does_not_count_in_the_fire_lag():
    schedule = cron_schedule(job="tests.jobs.add", args=[1, 2])
    schedule.backfill(T0, T0 + timedelta(minutes=10), now=NOW)
    (run,) = run_due(now=NOW)
    assert run.started_at - run.plan_time >= timedelta(hours=1)
    assert health.fire_lag(NOW) == health.Lag(0, None, None)


@pytest.mark.django_db
def test_cancelling_the_waiting_backfilled_runs_stops_the_backfill():
    schedule = cron_schedule()
    schedule.backfill(T0, NOW, now=NOW)
    waiting = Run.objects.filter(schedule=schedule, trigger="backfill").waiting()
    assert leases.request_cancel(waiting, NOW) == (6, 0)
    assert run_due(now=NOW + timedelta(minutes=1)) == []


@pytest.mark.django_db(transaction=True)
def test_backfilled_runs_of_a_handed_off_schedule_are_enqueued_once_released():
    backend = taskbackends.framework().task_backends["dummy"]
    backend.clear()
    schedule = cron_schedule(tasks_backend="dummy")
    result = schedule.backfill(T0, T0 + timedelta(minutes=30), rate=0.01)
    assert handoff.dispatch() == 1  # the first is released at once, the next in 100 s
    assert [r.args[0] for r in backend.results] == [backfilled(schedule)[0].pk]
    assert result.last_release - result.first_release == timedelta(seconds=200)
    backend.clear()


def test_a_backfill_costs_the_same_few_queries_however_many_runs_it_records(postgres):
    # (SQLite's bulk insert is split by its limit on parameters per statement.)
    def queries_of(minutes):
        schedule = cron_schedule(cron="* * * * *")
        with CaptureQueriesContext(connection) as queries:
            schedule.backfill(NOW - timedelta(minutes=minutes), NOW, now=NOW)
        return len(queries)

    few = queries_of(5)
    assert queries_of(500) == few
    assert few <= 6


@pytest.mark.processes
def test_real_schedulers_run_each_backfilled_run_once_never_before_its_release(postgres, children):
    schedule = cron_schedule(cron="* * * * *", job="tests.jobs.record")
    now = clock.now()
    result = schedule.backfill(now - timedelta(minutes=8), now, rate=5)
    for _ in range(2):
        children.start("--workers", "4")
    runs = Run.objects.filter(schedule=schedule, trigger="backfill")
    wait_for(lambda: not runs.active().exists(), 60, "the backfilled runs to end")
    assert set(runs.values_list("status", flat=True)) == {"succeeded"}
    # The schedule also fires every minute from now on: a minute that ends before the check
    # adds a scheduled run of its own, which is not the backfill's to count.
    executed = Execution.objects.filter(schedule=schedule.name, plan_time__lte=now)
    executed = executed.order_by("plan_time")
    assert list(executed.values_list("plan_time", flat=True)) == fire_times(
        "* * * * *", now - timedelta(minutes=8), now
    )
    spacing = timedelta(seconds=0.2)
    claimed = Lease.objects.filter(run__in=runs).order_by("run__plan_time")
    for index, acquired_at in enumerate(claimed.values_list("acquired_at", flat=True)):
        assert acquired_at >= result.first_release + index * spacing


@pytest.mark.django_db
def test_the_limit_counts_one_run_per_scope_key_of_a_fanned_out_schedule():
    schedule = cron_schedule(cron="* * * * *", job="tests.jobs.per_tenant", scopes="tests.regions")
    start = NOW - timedelta(minutes=backfill.MAX_RUNS // 2 + 1)
    with pytest.raises(ValueError, match="2 scope keys per plan time"):
        schedule.backfill(start, NOW, now=NOW)
    assert not backfilled(schedule)


@pytest.mark.django_db
def test_each_backfilled_run_is_announced_as_planned(django_capture_on_commit_callbacks):
    schedule = cron_schedule()
    RunFactory(schedule=schedule, plan_time=T0, status=Run.Status.SUCCEEDED)
    got = []

    def receiver(sender, **arguments):
        got.append((arguments["run_id"], arguments["plan_time"], arguments["status"]))

    signals.run_planned.connect(receiver, weak=False, dispatch_uid="test_backfill")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            schedule.backfill(T0, T0 + timedelta(minutes=30), now=NOW)
    finally:
        signals.run_planned.disconnect(dispatch_uid="test_backfill")
    runs = backfilled(schedule)
    assert got == [(run.pk, run.plan_time, "retrying") for run in runs]
