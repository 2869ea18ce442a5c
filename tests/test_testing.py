"""django_periodic.testing: the helpers our users test their jobs with."""

from datetime import timedelta

import pytest

from django_periodic import UnknownJob
from django_periodic.models import Lease, Run, Schedule
from django_periodic.testing import assert_fire_times, call_job, fire_times, run_due
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import utc

BERLIN = "Europe/Berlin"


# run_due


@pytest.mark.django_db
def test_run_due_plans_and_executes_a_fire_at_the_given_time():
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    fire = schedule.next_fire_at
    (run,) = run_due(now=fire)
    assert (run.plan_time, run.status, run.result) == (fire, "succeeded", 3)
    assert run.leases.get().outcome == Lease.Outcome.SUCCEEDED
    schedule.refresh_from_db()
    assert schedule.next_fire_at == fire + timedelta(minutes=1)


@pytest.mark.django_db
def test_run_due_before_the_first_fire_runs_nothing():
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    assert run_due(now=schedule.next_fire_at - timedelta(seconds=1)) == []
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_run_due_records_a_failure_and_runs_the_retry_when_it_is_due():
    schedule = ScheduleFactory(job="tests.jobs.explode", max_attempts=2)
    (first,) = run_due(now=schedule.next_fire_at)
    assert (first.status, first.attempt, first.error_code) == ("retrying", 1, "RuntimeError")
    assert first.next_retry_at > schedule.next_fire_at
    (retried,) = run_due(now=first.next_retry_at)
    assert (retried.pk, retried.status, retried.attempt) == (first.pk, "failed", 2)


@pytest.mark.django_db
def test_run_due_runs_a_queued_run_once_the_active_one_ends():
    schedule = ScheduleFactory(job="tests.jobs.noop", overlap=Schedule.Overlap.QUEUE)
    fire = schedule.next_fire_at
    active = RunFactory(schedule=schedule, plan_time=fire - timedelta(seconds=30), exclusive=True)
    runs = run_due(now=fire)
    assert [(r.pk, r.status) for r in runs] == [(active.pk, "succeeded"), (runs[1].pk, "succeeded")]
    assert runs[1].plan_time == fire


@pytest.mark.django_db
def test_run_due_awaits_an_async_job():
    schedule = ScheduleFactory(job="tests.jobs.add_later", args=[2, 3])
    (run,) = run_due(now=schedule.next_fire_at)
    assert (run.status, run.result) == ("succeeded", 5)


@pytest.mark.django_db
def test_run_due_executes_runs_handed_to_a_tasks_backend_unless_told_not_to():
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 1], tasks_backend="dummy")
    assert run_due(now=schedule.next_fire_at, handed_off=False) == []
    run = Run.objects.get()
    assert (run.tasks_backend, run.status) == ("dummy", "pending")
    (executed,) = run_due(now=schedule.next_fire_at)
    assert (executed.pk, executed.status, executed.result) == (run.pk, "succeeded", 2)


@pytest.mark.django_db
def test_run_due_far_ahead_is_downtime_to_the_misfire_policy():
    schedule = ScheduleFactory(job="tests.jobs.noop")  # misfire "latest", grace one minute
    later = schedule.next_fire_at + timedelta(minutes=10)
    (run,) = run_due(now=later)
    assert (run.plan_time, run.status) == (later, "succeeded")
    assert Run.objects.filter(status="skipped", error_code="missed").count() == 10


@pytest.mark.django_db
def test_run_due_defaults_to_the_database_clock_and_runs_a_manual_run():
    run = ScheduleFactory(job="tests.jobs.add", args=[4, 4]).run_now()
    assert [(r.pk, r.result) for r in run_due()] == [(run.pk, 8)]


def test_periodic_run_due_fixture_runs_what_is_due(periodic_run_due, periodic_now):
    ScheduleFactory(job="tests.jobs.add", args=[5, 5], start_at=periodic_now)
    (executed,) = periodic_run_due(now=periodic_now + timedelta(minutes=1))
    assert (executed.plan_time, executed.result) == (periodic_now + timedelta(minutes=1), 10)


# call_job


def test_call_job_returns_what_the_job_returns():
    assert call_job("tests.jobs.add", 2, b=3) == 5


def test_call_job_raises_what_the_job_raises():
    with pytest.raises(RuntimeError, match="kaput"):
        call_job("tests.jobs.explode", "kaput")


def test_call_job_awaits_an_async_job():
    assert call_job("tests.jobs.add_later", 2, 5) == 7


def test_call_job_refuses_an_unknown_job_or_wrong_arguments():
    with pytest.raises(UnknownJob):
        call_job("tests.jobs.gone")
    with pytest.raises(TypeError):
        call_job("tests.jobs.add", 1)


@pytest.mark.django_db
def test_call_job_gives_a_context_with_an_unsaved_run_and_a_harmless_heartbeat():
    result = call_job("tests.jobs.report_context")
    assert (result["run"], result["attempt"]) == (None, 1)
    assert (result["heartbeat"], result["cancelled"]) == (True, False)
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_call_job_of_a_schedule_uses_its_arguments_and_its_run_has_the_schedule():
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1], kwargs={"b": 9})
    assert call_job(schedule) == 10
    assert call_job(schedule, 1, 1) == 2
    scoped = ScheduleFactory(job="tests.jobs.per_tenant", kwargs={"greeting": "hi"})
    assert call_job(scoped) == "hi "


# fire_times / assert_fire_times


def test_fire_times_lists_the_fires_in_a_range_start_included_end_excluded():
    assert fire_times("0 * * * *", utc(2026, 1, 1, 0), utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, 0),
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]


def test_a_berlin_daily_0230_fires_once_right_after_the_spring_forward_change():
    # 2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist, so it fires at 03:00 CEST.
    assert_fire_times(
        Schedule(cron="30 2 * * *", timezone=BERLIN),
        utc(2026, 3, 28),
        utc(2026, 3, 31),
        [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
    )


def test_a_berlin_daily_0230_fires_once_on_the_fall_back_day():
    assert_fire_times(
        "30 2 * * *",
        utc(2026, 10, 25),
        utc(2026, 10, 26),
        [utc(2026, 10, 25, 0, 30)],
        timezone=BERLIN,
    )


def test_assert_fire_times_names_the_missing_and_unexpected_times_in_local_time():
    with pytest.raises(AssertionError) as failed:
        assert_fire_times(
            "30 2 * * *",
            utc(2026, 3, 29),
            utc(2026, 3, 30),
            [utc(2026, 3, 29, 0, 30)],  # 02:30 as if nothing changed
            timezone=BERLIN,
        )
    message = str(failed.value)
    assert "missing:    2026-03-29 00:30:00 UTC (2026-03-29 01:30:00 CET Europe/Berlin)" in message
    assert "unexpected: 2026-03-29 01:00:00 UTC (2026-03-29 03:00:00 CEST Europe/Berlin)" in message


def test_fire_times_refuses_an_unbounded_range():
    with pytest.raises(ValueError, match="More than"):
        fire_times("* * * * *", utc(2026, 1, 1), utc(2027, 1, 1))
