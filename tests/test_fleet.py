"""Mixed releases (engine/planning/fleet.py): during a rolling deploy a process never fails,
disables or claims what it merely does not know while a live process knows it."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.db import clock
from django_periodic.engine import fleet
from django_periodic.engine.loop.scheduler import look_ahead
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims
from django_periodic.models import Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import set_cursor
from tests.models import Execution
from tests.processes import wait_for

NEW_JOB = "tests.jobs.added_in_new_release"
GONE = "tests.jobs.removed_from_code"  # no process of any release has it
OLD_RELEASE = {"PERIODIC_TEST_OLD_RELEASE": "1"}  # a scheduler whose code lacks NEW_JOB


def of_job(job: str, now, **fields) -> Schedule:
    """A due every-10-seconds schedule whose job, stored past validation, is ``job``."""
    schedule = ScheduleFactory(interval=timedelta(seconds=10), start_at=now, **fields)
    Schedule.objects.filter(pk=schedule.pk).update(job=job)
    set_cursor(schedule, now)
    return schedule


def alive_with(*jobs: str, now) -> None:
    """Another live process, whose code registers ``jobs`` (this one's does not, here)."""
    SchedulerProcessFactory(started_at=now, jobs=list(jobs))


# -- planning ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_job_another_live_process_has_is_planned_as_usual(now):
    alive_with(GONE, now=now)
    schedule = of_job(GONE, now)
    for tick in range(5):  # past PLANNING_FAILURE_LIMIT ticks
        result = planner.plan_due(now + timedelta(seconds=10 * tick))
        assert (result.failed, result.disabled) == ([], [])
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.last_error, schedule.planning_failures) == (True, "", 0)
    assert schedule.job_unknown_since is None
    assert Run.objects.filter(schedule=schedule).count() == 5


@pytest.mark.django_db
def test_a_job_no_live_process_has_is_planned_then_disabled_after_the_grace(now, settings):
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 60}
    alive_with("tests.jobs.noop", now=now)
    schedule = of_job(GONE, now)
    for tick in range(6):  # 0 to 50 s: within the grace, planned as usual
        assert planner.plan_due(now + timedelta(seconds=10 * tick)).disabled == []
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.job_unknown_since) == (True, now)
    assert Run.objects.filter(schedule=schedule).count() == 6
    result = planner.plan_due(now + timedelta(seconds=60))
    assert result.disabled == [schedule.name]
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "no live process has had its job" in schedule.last_error
    assert "UNKNOWN_JOB_GRACE" in schedule.last_error
    assert Run.objects.filter(schedule=schedule).count() == 6  # the last fire not planned


@pytest.mark.django_db
def test_a_job_that_comes_back_within_the_grace_starts_the_count_again(now, settings):
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 60}
    schedule = of_job(GONE, now)
    planner.plan_due(now)
    alive_with(GONE, now=now)  # the new release's first process starts
    planner.plan_due(now + timedelta(seconds=10))
    schedule.refresh_from_db()
    assert schedule.job_unknown_since is None


@pytest.mark.django_db
def test_a_live_process_that_does_not_say_its_jobs_may_have_any(now, settings):
    # A process of a release before mixed releases were handled: its jobs column is NULL.
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 0}
    SchedulerProcessFactory(started_at=now, jobs=None)
    schedule = of_job(GONE, now)
    assert planner.plan_due(now).disabled == []
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.job_unknown_since) == (True, None)


@pytest.mark.django_db
@pytest.mark.parametrize("stored", [5, "tests.jobs.removed_from_code", {"a": 1}, [1, None]])
def test_an_odd_jobs_value_stored_by_hand_fails_no_planning(now, settings, stored):
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 0}
    SchedulerProcessFactory(started_at=now, jobs=stored)
    schedule = of_job(GONE, now)
    result = planner.plan_due(now)
    assert result.failed == [] or result.disabled == [schedule.name]
    assert fleet.skip_undeployed(now, "default") == []


@pytest.mark.django_db
def test_a_schedule_of_a_job_here_costs_no_query_about_the_others(now):
    of_job("tests.jobs.noop", now)
    with CaptureQueriesContext(connection) as counted:
        planner.plan_due(now)
    process_table = SchedulerProcess._meta.db_table
    assert not any(process_table in query["sql"] for query in counted.captured_queries)


# -- claiming ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_process_claims_only_runs_whose_job_it_has(now):
    here = RunFactory(schedule=ScheduleFactory(job="tests.jobs.noop"), plan_time=now)
    elsewhere = RunFactory(schedule=ScheduleFactory(), plan_time=now, job_name=GONE)
    me = SchedulerProcessFactory(started_at=now, jobs=list(fleet.local_jobs()))
    claimed = claims.claim(me, now, 10)
    assert [claim.run.pk for claim in claimed] == [here.pk]
    elsewhere.refresh_from_db()
    assert (elsewhere.status, elsewhere.attempt) == ("pending", 0)
    assert claims.claim_run(elsewhere.pk, "a tasks worker", now=now) is None


@pytest.mark.django_db
def test_a_run_only_another_release_can_start_is_no_work_in_the_look_ahead(now):
    RunFactory(schedule=ScheduleFactory(), plan_time=now, job_name=GONE)
    retry = RunFactory(schedule=ScheduleFactory(), plan_time=now, job_name=GONE)
    Run.objects.filter(pk=retry.pk).update(status="retrying", attempt=1, next_retry_at=now)
    ahead = look_ahead()
    assert (ahead.next_pending, ahead.next_retry) == (None, None)
    assert not ahead.claimable()
    RunFactory(schedule=ScheduleFactory(job="tests.jobs.noop"), plan_time=now)
    assert look_ahead().next_pending == now


# -- runs no live process can start -----------------------------------------------------------


@pytest.mark.django_db
def test_a_run_no_live_process_can_start_is_skipped_at_its_start_deadline(now):
    alive_with("tests.jobs.noop", now=now)
    late = RunFactory(
        schedule=ScheduleFactory(),
        plan_time=now - timedelta(minutes=2),
        start_deadline=now - timedelta(seconds=1),
        job_name=GONE,
    )
    waiting = RunFactory(
        schedule=ScheduleFactory(), plan_time=now, start_deadline=now + timedelta(minutes=1)
    )
    Run.objects.filter(pk=waiting.pk).update(job_name=GONE)
    assert fleet.skip_undeployed(now, "default") == [late.schedule_id]
    late.refresh_from_db()
    assert (late.status, late.error_code) == ("skipped", "job_not_deployed")
    assert GONE in late.error_message
    assert Run.objects.get(pk=waiting.pk).status == "pending"


@pytest.mark.django_db
def test_a_retry_no_live_process_can_start_is_skipped_after_the_grace(now, settings):
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 60}
    retry = RunFactory(schedule=ScheduleFactory(), plan_time=now, job_name=GONE)
    Run.objects.filter(pk=retry.pk).update(status="retrying", attempt=1, next_retry_at=now)
    assert fleet.skip_undeployed(now + timedelta(seconds=59), "default") == []
    assert fleet.skip_undeployed(now + timedelta(seconds=61), "default") == [retry.schedule_id]
    assert Run.objects.get(pk=retry.pk).error_code == "job_not_deployed"


@pytest.mark.django_db
def test_a_late_run_a_live_process_can_start_is_left_to_it(now):
    alive_with(GONE, now=now)
    late = RunFactory(
        schedule=ScheduleFactory(), plan_time=now, start_deadline=now - timedelta(seconds=1)
    )
    Run.objects.filter(pk=late.pk).update(job_name=GONE)
    assert fleet.skip_undeployed(now, "default") == []
    assert Run.objects.get(pk=late.pk).status == "pending"


# -- real processes of two releases -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rolling_deploy_that_adds_a_job_runs_it_once_the_new_release_joins(children, postgres):
    """The old release alone first: it plans the new job's schedule and neither fails,
    disables nor claims it; then a process of the new release joins and runs every fire
    from then on, once each."""
    old = children.start("--workers", "2", env=OLD_RELEASE)
    old.wait_for_line("Recovery done")
    start = clock.now() + timedelta(seconds=1)
    schedule = Schedule(
        name="added", job=NEW_JOB, interval=timedelta(seconds=1), start_at=start, misfire="all"
    )
    schedule.full_clean()  # this process has the job: the form and the API accept it
    schedule.save()
    runs = Run.objects.filter(schedule=schedule)
    wait_for(lambda: runs.count() >= 5, 30, "the old release to plan 5 fires")
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.last_error, schedule.planning_failures) == (True, "", 0)
    # None claimed, failed or skipped for its job (its overlap policy skips fires while
    # the first waits).
    assert set(runs.values_list("status", "error_code")) <= {
        ("pending", ""),
        ("skipped", "overlap"),
    }
    assert not Execution.objects.exists()

    new = children.start("--workers", "2")
    joined = clock.now()
    wait_for(
        lambda: Execution.objects.filter(plan_time__gt=joined).count() >= 3,
        30,
        "the new release to run 3 fires",
    )
    assert old.terminate() == 0 and new.terminate() == 0
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.last_error) == (True, "")
    executed = list(Execution.objects.values_list("plan_time", flat=True))
    assert len(executed) == len(set(executed)), "a plan time ran twice"
    assert not runs.filter(status="failed").exists()
    # Every run that ran was started by the new release's process.
    assert set(Execution.objects.values_list("pid", flat=True)) == {new.pid}
