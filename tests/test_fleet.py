"""Mixed releases (engine/planning/fleet.py): during a rolling deploy a process never fails,
disables or claims what it merely does not know while a live process knows it."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.choices import LEDGER_FORMAT
from django_periodic.db import clock
from django_periodic.engine import fleet
from django_periodic.engine.loop.scheduler import look_ahead
from django_periodic.engine.planning import attention, planner
from django_periodic.engine.planning.after import plan_after
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


# -- rows of a later ledger format ----------------------------------------------------------

LATER = LEDGER_FORMAT + 1  # a row a later release wrote, for a process of its own to handle


def of_later_format(schedule: Schedule, **fields) -> Schedule:
    """``schedule`` as a later release would leave it: its format, and a trigger this
    release cannot read (it fails to plan here)."""
    Schedule.objects.filter(pk=schedule.pk).update(ledger_format=LATER, **fields)
    return schedule


@pytest.mark.django_db
def test_a_schedule_of_a_later_format_is_neither_planned_failed_nor_disabled(now, settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 2}
    later = of_later_format(of_job("tests.jobs.noop", now), interval=None, cron="61 * * * *")
    for tick in range(4):  # past PLANNING_FAILURE_LIMIT ticks
        result = planner.plan_due(now + timedelta(seconds=10 * tick))
        assert (result.failed, result.disabled) == ([], [])
    stored = Schedule.objects.get(pk=later.pk)
    assert (stored.enabled, stored.last_error, stored.planning_failures) == (True, "", 0)
    assert stored.next_fire_at == now  # its cursor, left as it was
    assert not Run.objects.filter(schedule=later).exists()
    assert look_ahead().next_fire is None  # and no wake-up for it
    # Of this release's format, the same row is planned, and fails as a bad row does.
    Schedule.objects.filter(pk=later.pk).update(ledger_format=LEDGER_FORMAT)
    assert planner.plan_due(now + timedelta(seconds=40)).failed == [later.name]


@pytest.mark.django_db(transaction=True)
def test_a_downstream_of_a_later_format_is_not_planned(now):
    early = now - timedelta(hours=1)  # both made before the plan time
    up = ScheduleFactory(name="up")
    Schedule.objects.filter(pk=up.pk).update(created_at=early)
    down = ScheduleFactory(name="down", interval=None, after=["up"])
    of_later_format(down, created_at=early)
    RunFactory(schedule=up, plan_time=now - timedelta(minutes=1), status="succeeded")
    plan_after(now)
    assert not Run.objects.filter(schedule=down).exists()
    Schedule.objects.filter(pk=down.pk).update(ledger_format=LEDGER_FORMAT)
    plan_after(now)
    assert Run.objects.filter(schedule=down).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_alerts_pass_leaves_a_schedule_of_a_later_format_alone(now):
    schedule = ScheduleFactory(name="nightly", alert_failures=1, pause_after_failures=1)
    RunFactory(schedule=schedule, plan_time=now - timedelta(minutes=1), status="failed")
    of_later_format(schedule)
    attention.evaluate(now)
    stored = Schedule.objects.get(pk=schedule.pk)
    assert (stored.attention_reason, stored.paused_until) == ("", None)
    Schedule.objects.filter(pk=schedule.pk).update(ledger_format=LEDGER_FORMAT)
    attention.evaluate(now)
    assert Schedule.objects.get(pk=schedule.pk).attention_reason == "failing"


@pytest.mark.django_db
def test_a_run_of_a_later_format_is_neither_claimed_nor_work_in_the_look_ahead(now):
    run = RunFactory(schedule=ScheduleFactory(job="tests.jobs.noop"), plan_time=now)
    Run.objects.filter(pk=run.pk).update(ledger_format=LATER)
    me = SchedulerProcessFactory(started_at=now, jobs=list(fleet.local_jobs()))
    assert claims.claim(me, now, 10) == []
    assert claims.claim_run(run.pk, "a tasks worker", now=now) is None
    assert look_ahead().next_pending is None
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.attempt) == ("pending", 0)
    Run.objects.filter(pk=run.pk).update(ledger_format=LEDGER_FORMAT)
    assert [claim.run.pk for claim in claims.claim(me, now, 10)] == [run.pk]


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


@pytest.mark.django_db(transaction=True)
def test_a_running_scheduler_leaves_rows_of_a_later_format_to_their_release(children, postgres):
    """A real process beside a schedule and a run that a later release wrote: it plans and
    runs its own, and neither plans, fails, disables nor claims those, until they are of
    its format."""
    now = clock.now()
    ScheduleFactory(name="fine", job="tests.jobs.record", interval=timedelta(seconds=1))
    later = of_later_format(
        ScheduleFactory(name="later", job="tests.jobs.record"), interval=None, cron="61 * * * *"
    )
    set_cursor(later, now)
    waiting = RunFactory(schedule=later, plan_time=now, job_name="tests.jobs.record")
    Run.objects.filter(pk=waiting.pk).update(ledger_format=LATER, start_deadline=None)
    scheduler = children.start("--workers", "2")
    scheduler.wait_for_line("Recovery done")
    executions = Execution.objects.filter(schedule="fine")
    wait_for(lambda: executions.count() >= 3, 30, "3 fires of this release's schedule")
    stored = Schedule.objects.get(pk=later.pk)
    assert (stored.enabled, stored.last_error, stored.planning_failures) == (True, "", 0)
    assert Run.objects.filter(schedule=later).count() == 1
    assert Run.objects.filter(pk=waiting.pk, status="pending", attempt=0).exists()
    assert not Execution.objects.filter(schedule="later").exists()
    assert SchedulerProcess.objects.get(pid=scheduler.pid).ledger_format == LEDGER_FORMAT

    # The same rows, of this release's format: run, and failed as a bad row.
    Run.objects.filter(pk=waiting.pk).update(ledger_format=LEDGER_FORMAT)
    Schedule.objects.filter(pk=later.pk).update(ledger_format=LEDGER_FORMAT)
    ran = Execution.objects.filter(schedule="later", plan_time=now)
    wait_for(ran.exists, 30, "the run, once of this release's format")
    wait_for(
        lambda: Schedule.objects.get(pk=later.pk).planning_failures >= 1,
        30,
        "the bad trigger, once of this release's format, to fail planning",
    )
    assert scheduler.terminate() == 0
