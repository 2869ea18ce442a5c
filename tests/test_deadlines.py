"""Deadlines to finish by (``finish_within``): a run not finished that long after its plan
time, whatever held it back, is late: flagged and announced once, its schedule needs
attention, explain() says by how much, and with ``cancel_when_late`` it is cancelled.
"""

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.duration import duration_string

from django_periodic import signals
from django_periodic.admin.forms import ScheduleForm
from django_periodic.db import clock
from django_periodic.engine.loop import housekeeping
from django_periodic.engine.loop.scheduler import Scheduler, look_ahead
from django_periodic.engine.planning import attention, planner
from django_periodic.engine.runs import deadlines, retries
from django_periodic.models import Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import run_url, set_cursor
from tests.processes import wait_for
from tests.test_admin_forms import data as form_data
from tests.test_bad_rows import unchecked  # noqa: F401 (a fixture)
from tests.threads import Thread

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)
DAYS = timedelta(days=3)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def late():
    """The ``run_late`` signals received, as (run id, arguments)."""
    got: list[tuple[int, dict]] = []

    def receiver(signal, sender, **arguments):
        assert sender is Run
        got.append((arguments["run_id"], arguments))

    signals.run_late.connect(receiver, weak=False, dispatch_uid="test_deadlines")
    yield got
    signals.run_late.disconnect(dispatch_uid="test_deadlines")


def hourly(**fields) -> Schedule:
    """An hourly schedule from T0, due at T0, with a deadline of 10 minutes."""
    fields = {"interval": HOUR, "start_at": T0, "finish_within": 10 * MINUTE, **fields}
    schedule = ScheduleFactory(**fields)
    set_cursor(schedule, T0)
    return schedule


# -- the deadline, as each run is recorded ------------------------------------------------------


def test_a_planned_run_must_finish_within_finish_within_of_its_plan_time():
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    run = Run.objects.get(schedule=schedule)
    assert (run.plan_time, run.finish_by, run.late_at) == (T0, T0 + 10 * MINUTE, None)


def test_a_schedule_without_a_deadline_records_none():
    schedule = hourly(finish_within=None)
    planner.plan_due(T0 + SECOND)
    assert Run.objects.get(schedule=schedule).finish_by is None


def test_a_manual_run_and_a_retry_count_their_deadline_from_now():
    schedule = hourly()
    now = clock.now()
    manual = schedule.run_now()
    assert manual.finish_by == manual.plan_time + 10 * MINUTE
    assert manual.plan_time >= now
    Run.objects.filter(pk=manual.pk).update(status="failed", finished_at=now)
    old = RunFactory(schedule=schedule, plan_time=now - HOUR, status="failed")
    retry = schedule.plan_extra_run(
        clock.now(), trigger=Run.Trigger.RETRY, plan_time=old.plan_time, **old.snapshot
    )
    # Its plan time is an hour ago: counted from it, the retry would be late as recorded.
    assert retry.finish_by >= now + 10 * MINUTE


def test_a_backfilled_run_has_no_deadline():
    schedule = hourly()
    schedule.backfill(T0, T0 + 3 * HOUR)
    assert (
        list(Run.objects.filter(schedule=schedule).values_list("finish_by", flat=True))
        == [None] * 3
    )


# -- found late, once ---------------------------------------------------------------------------


def test_a_run_held_back_by_retries_and_one_queued_behind_it_are_each_flagged_late_once(late):
    schedule = hourly(overlap="queue", max_attempts=3)
    planner.plan_due(T0 + SECOND)
    first = Run.objects.get(schedule=schedule)
    # Its first attempt failed: it waits to be retried, past its deadline.
    Run.objects.filter(pk=first.pk).update(
        status="retrying", attempt=1, next_retry_at=T0 + 2 * HOUR
    )
    assert deadlines.flag_late(T0 + 10 * MINUTE, "default") == []  # due by then: not late
    found = deadlines.flag_late(T0 + 11 * MINUTE, "default")
    assert [run.pk for run in found] == [first.pk]
    # The next fire, queued behind the first (its overlap): late in its turn.
    Run.objects.filter(pk=first.pk).update(status="running")
    set_cursor(schedule, T0 + HOUR)
    planner.plan_due(T0 + HOUR + SECOND)
    second = Run.objects.get(schedule=schedule, plan_time=T0 + HOUR)
    assert (second.status, second.finish_by) == ("queued", T0 + HOUR + 10 * MINUTE)
    found = deadlines.flag_late(T0 + 2 * HOUR, "default")
    assert [run.pk for run in found] == [second.pk]
    assert deadlines.flag_late(T0 + 2 * HOUR, "default") == []  # again: neither is flagged
    assert [run_id for run_id, _ in late] == [first.pk, second.pk]
    arguments = late[0][1]
    assert arguments["finish_by"] == T0 + 10 * MINUTE
    assert arguments["late_by"] == MINUTE
    assert (arguments["status"], arguments["attempt"], arguments["cancelled"]) == (
        "retrying",
        1,
        False,
    )
    first.refresh_from_db()
    assert first.late_at == T0 + 11 * MINUTE
    assert set(Run.objects.late().values_list("pk", flat=True)) == {first.pk, second.pk}


def test_a_run_that_finishes_in_time_is_never_late(late):
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    Run.objects.filter(schedule=schedule).update(
        status="succeeded", started_at=T0, finished_at=T0 + 9 * MINUTE
    )
    assert deadlines.flag_late(T0 + DAYS, "default") == []
    assert late == [] and not Run.objects.late().exists()


def test_two_schedulers_flagging_at_once_announce_each_late_run_once(postgres, late):
    """Two threads, each with its own connection, flag at the same moment: each late run
    is flagged by one and announced once."""
    schedules = [hourly(overlap="concurrent") for _ in range(20)]
    planner.plan_due(T0 + SECOND)
    assert Run.objects.filter(finish_by=T0 + 10 * MINUTE).count() == len(schedules)
    barrier = threading.Barrier(2)
    found: list[list[int]] = [[], []]

    def flag(n: int) -> None:
        barrier.wait()
        found[n] = [run.pk for run in deadlines.flag_late(T0 + HOUR, "default")]

    threads = [Thread(target=flag, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flagged = found[0] + found[1]
    assert sorted(flagged) == sorted(Run.objects.values_list("pk", flat=True))
    assert sorted(run_id for run_id, _ in late) == sorted(flagged)  # once each


def test_an_idle_pass_is_one_statement():
    hourly()
    planner.plan_due(T0 + SECOND)  # a run with a deadline, not passed yet
    with CaptureQueriesContext(connection) as captured:
        assert deadlines.flag_late(T0 + MINUTE, "default") == []
    assert len(captured.captured_queries) == 1, captured.captured_queries
    if connection.vendor == "postgresql":
        # Read on the partial index of runs with a deadline to watch, not on the index of
        # every active run: with many active runs and statistics that say so, the two no
        # longer cost the same (with one run each, PostgreSQL picks either).
        other = ScheduleFactory(name="no-deadline")
        Run.objects.bulk_create(
            RunFactory.build(schedule=other, plan_time=T0 - n * MINUTE, exclusive=False)
            for n in range(500)
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_periodic_run")
            cursor.execute("SET enable_seqscan = off")
            cursor.execute("EXPLAIN " + captured.captured_queries[0]["sql"].replace("%%", "%"))
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("RESET enable_seqscan")
        assert "periodic_run_deadline" in plan, plan


# -- when it is looked for: just after the earliest deadline ------------------------------------


def test_the_look_ahead_reads_the_earliest_deadline_of_a_run_not_found_late():
    assert look_ahead().next_deadline is None  # no run has one: nothing to wake for
    hourly()
    hourly(finish_within=5 * MINUTE)
    planner.plan_due(T0 + SECOND)
    assert look_ahead().next_deadline == T0 + 5 * MINUTE
    deadlines.flag_late(T0 + 6 * MINUTE, "default")
    assert look_ahead().next_deadline == T0 + 10 * MINUTE


def test_a_planning_scheduler_wakes_just_after_the_earliest_deadline(settings):
    settings.DJANGO_PERIODIC = {"POLL_INTERVAL": HOUR, "HEARTBEAT_INTERVAL": HOUR}
    later = clock.now() + DAYS
    ScheduleFactory(interval=HOUR, start_at=later)  # no deadline
    scheduler = Scheduler(workers=0)
    scheduler.boot()
    now, wake_at = scheduler.tick()
    assert wake_at > now + MINUTE  # no run has a deadline: no wake-up for one
    run = ScheduleFactory(interval=HOUR, start_at=later, finish_within=5 * SECOND).run_now()
    now, wake_at = scheduler.tick()
    assert wake_at == run.finish_by + housekeeping.LATE_AFTER


def test_a_deadline_that_passes_is_looked_at_then_not_at_the_next_alert_interval(late):
    housekeeper = Scheduler(workers=0).housekeeper
    schedule = hourly(finish_within=5 * SECOND)
    planner.plan_due(T0 + SECOND)
    run = Run.objects.get(schedule=schedule)
    ahead = look_ahead()
    deadline = ahead.next_deadline
    assert deadline == run.finish_by == T0 + 5 * SECOND
    assert housekeeper.attend(T0 + SECOND, ahead) is not None  # the first look: in time
    assert housekeeper.next_attention == T0 + SECOND + MINUTE
    assert housekeeper.deadline_wake(T0 + SECOND, ahead) == deadline + housekeeping.LATE_AFTER
    assert housekeeper.attend(deadline, ahead) is None  # not behind it yet: in time
    assert housekeeper.attend(deadline + housekeeping.LATE_AFTER, ahead) is not None
    assert [run_id for run_id, _ in late] == [run.pk]
    assert look_ahead().next_deadline is None  # found late: no more wake-ups for it


def test_a_burst_of_deadlines_is_looked_at_once_a_second_at_most():
    housekeeper = Scheduler(workers=0).housekeeper
    hourly(finish_within=SECOND)
    planner.plan_due(T0)
    ahead = look_ahead()
    housekeeper.attend(T0 + SECOND / 2, ahead)
    # Its deadline passes half a second after that look: the next is a second after it.
    floor = T0 + SECOND / 2 + SECOND
    assert housekeeper.deadline_wake(T0 + SECOND / 2, ahead) == floor
    assert housekeeper.attend(T0 + 1.2 * SECOND, ahead) is None
    assert housekeeper.attend(floor, ahead) is not None


# -- what it means: attention, explain, cancel ---------------------------------------------------


def test_a_late_run_makes_its_schedule_need_attention_until_a_success():
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    now = T0 + 11 * MINUTE
    deadlines.flag_late(now, "default")
    (change,) = attention.evaluate(now, "default").changes
    assert (change.reason, change.schedule) == ("late", schedule.name)
    assert change.message == "a run was not finished within 10 minutes of its plan time"
    assert list(Schedule.objects.needing_attention()) == [schedule]
    schedule.refresh_from_db()
    assert schedule.attention_reason == "late"
    # It ends succeeded after all: that success is its last, and it recovers.
    Run.objects.filter(schedule=schedule).update(status="succeeded", finished_at=now)
    (change,) = attention.evaluate(now, "default").changes
    assert change.ended and change.previous == "late"


def test_explain_shows_how_late_a_run_was():
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    deadlines.flag_late(T0 + 11 * MINUTE, "default")
    Run.objects.filter(schedule=schedule).update(status="succeeded", finished_at=T0 + 25 * MINUTE)
    (account,) = schedule.explain(T0, T0 + MINUTE)
    assert (account.status, account.late_by) == ("succeeded", 15 * MINUTE)
    assert "Late by 15 min." in account.detail
    assert account.as_dict()["late_by"] == 900.0


def test_explain_says_nothing_of_lateness_for_a_run_in_time():
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    (account,) = schedule.explain(T0, T0 + MINUTE)
    assert account.late_by is None and "Late" not in account.detail


def test_cancel_when_late_cancels_a_waiting_run_and_asks_a_running_one_to_stop(late):
    waiting, running = hourly(cancel_when_late=True), hourly(cancel_when_late=True)
    planner.plan_due(T0 + SECOND)
    Run.objects.filter(schedule=running).update(status="running", attempt=1, started_at=T0)
    deadlines.flag_late(T0 + HOUR, "default")
    assert Run.objects.get(schedule=waiting).status == "cancelled"
    run = Run.objects.get(schedule=running)
    assert (run.status, run.cancel_requested_at) == ("running", T0 + HOUR)
    assert all(arguments["cancelled"] for _, arguments in late) and len(late) == 2


def test_without_cancel_when_late_a_late_run_goes_on():
    schedule = hourly()
    planner.plan_due(T0 + SECOND)
    deadlines.flag_late(T0 + HOUR, "default")
    run = Run.objects.get(schedule=schedule)
    assert (run.status, run.cancel_requested_at) == ("pending", None)


# -- bad values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (timedelta(seconds=-1), "finish_within must be positive."),
        (timedelta(0), "finish_within must be positive."),
        (timedelta(days=366), "finish_within must be at most 365 days."),
    ],
)
def test_a_bad_finish_within_is_refused_by_full_clean_and_the_admin_form(value, message):
    schedule = ScheduleFactory.build(finish_within=value)
    with pytest.raises(ValidationError) as refused:
        schedule.full_clean()
    assert refused.value.message_dict == {"finish_within": [message]}
    form = ScheduleForm(form_data(finish_within=duration_string(value)))
    assert not form.is_valid()
    assert form.errors == {"finish_within": [message]}


def test_the_admin_form_saves_a_deadline_and_its_cancel():
    form = ScheduleForm(form_data(finish_within="00:30:00", cancel_when_late="on"))
    assert form.is_valid(), form.errors
    schedule = form.save()
    assert (schedule.finish_within, schedule.cancel_when_late) == (30 * MINUTE, True)


# In the test's transaction: the CHECK constraints it drops come back with its rollback.
@pytest.mark.django_db(transaction=False)
@pytest.mark.usefixtures("unchecked")
def test_a_bad_value_written_past_the_checks_disables_that_schedule_alone(settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 2}
    bad, good = hourly(), hourly()
    Schedule.objects.filter(pk=bad.pk).update(finish_within=timedelta(days=-1))
    for n in range(2):
        set_cursor(good, T0 + n * HOUR)
        planner.plan_due(T0 + n * HOUR + SECOND)
    bad.refresh_from_db()
    assert not bad.enabled and "finish_within must be positive" in bad.last_error
    assert not Run.objects.filter(schedule=bad).exists()
    assert Run.objects.filter(schedule=good).count() == 2


@pytest.mark.django_db(transaction=False)
@pytest.mark.usefixtures("unchecked")
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (timedelta(days=-1), "finish_within must be positive."),
        (timedelta(0), "finish_within must be positive."),
        (timedelta(days=366), "finish_within must be at most 365 days."),
    ],
)
def test_a_manual_run_and_a_retry_refuse_a_finish_within_stored_out_of_its_range(value, message):
    schedule = hourly()
    failed = RunFactory(schedule=schedule, status="failed")
    Schedule.objects.filter(pk=schedule.pk).update(finish_within=value)
    refusals = (
        schedule.run_now,
        schedule.run_now_for_all_scopes,
        lambda: retries.plan_retry(failed, clock.now()),
    )
    for refused in refusals:
        with pytest.raises(ValidationError) as error:
            refused()
        assert error.value.message_dict == {"finish_within": [message]}  # as full_clean()
    assert list(Run.objects.values_list("pk", flat=True)) == [failed.pk]  # nothing recorded


@pytest.mark.django_db(transaction=False)
@pytest.mark.usefixtures("unchecked")
def test_the_admin_says_why_it_could_not_run_or_retry_such_a_schedule(admin_client):
    schedule = hourly()
    failed = RunFactory(schedule=schedule, status="failed")
    Schedule.objects.filter(pk=schedule.pk).update(finish_within=timedelta(days=366))
    why = "finish_within must be at most 365 days."
    schedules = reverse("admin:django_periodic_schedule_changelist")
    runs = reverse("admin:django_periodic_run_changelist")
    posts = {
        (schedules, f"{schedule} not run: {why}"): {
            "action": "run_now",
            "_selected_action": [schedule.pk],
        },
        (
            reverse("admin:django_periodic_schedule_run_now", args=[schedule.pk]),
            f"Not run: {why}",
        ): {},
        (runs, f"{failed} not retried: {why}"): {
            "action": "retry",
            "_selected_action": [failed.pk],
        },
        (run_url(failed, "retry"), f"Not retried: {why}"): {},
    }
    for (url, message), data in posts.items():
        response = admin_client.post(url, data, follow=True)
        assert [str(m) for m in response.context["messages"]] == [message]
    assert list(Run.objects.values_list("pk", flat=True)) == [failed.pk]


# -- a real scheduler ---------------------------------------------------------------------------

# The deadline pass runs with the attention pass, once an ALERT_INTERVAL; cancel requests
# reach a running job by NOTIFY on PostgreSQL, else once a heartbeat interval; a run made
# while the child sleeps is seen by NOTIFY, else within a POLL_INTERVAL.
CHILD_SETTINGS = {"ALERT_INTERVAL": 1, "HEARTBEAT_INTERVAL": 1, "POLL_INTERVAL": 0.2}


def run_when_ready(child, **fields) -> tuple[Schedule, Run]:
    """A schedule whose next fire is far off, and a run of it made now (``run_now()``: its
    deadline counts from now) once ``child`` is up, so that its job starts at once
    however long the child took to boot."""
    schedule = ScheduleFactory(interval=HOUR, start_at=clock.now() + HOUR, **fields)
    wait_for(lambda: SchedulerProcess.objects.exists(), 60, "the child to be up")
    return schedule, schedule.run_now()


@pytest.mark.processes
def test_a_running_scheduler_finds_a_job_that_overruns_late_and_cancels_it(children, tmp_path):
    notes = tmp_path / "notes"
    child = children.start("--workers", "1", settings=CHILD_SETTINGS)
    slow, made = run_when_ready(
        child,
        job="tests.jobs.work_until_stopped",
        kwargs={"notes": str(notes), "seconds": 60},
        finish_within=3 * SECOND,
        cancel_when_late=True,
    )
    assert made.finish_by == made.plan_time + 3 * SECOND
    wait_for(lambda: _lines(notes) == [f"{made.pk} started"], 30, "the job to start")
    run = wait_for(
        lambda: Run.objects.filter(pk=made.pk, status="cancelled").first(), 60, "the cancel"
    )
    assert run.late_at is not None and run.late_at >= run.finish_by
    # The job itself saw its token and stopped, well before its 60 seconds.
    wait_for(lambda: _lines(notes) == [f"{run.pk} started", f"{run.pk} stopped"], 10, "notes")
    wait_for(lambda: _attention(slow) == "late", 30, "the schedule to need attention")
    assert child.terminate() == 0
    assert child.output().count(f"Run {run.pk} of schedule") == 1  # found late once


@pytest.mark.processes
def test_a_running_scheduler_lets_a_late_job_run_on_without_cancel_when_late(children, tmp_path):
    notes = tmp_path / "notes"
    child = children.start("--workers", "1", settings=CHILD_SETTINGS)
    slow, made = run_when_ready(
        child,
        job="tests.jobs.work_until_stopped",
        kwargs={"notes": str(notes), "seconds": 6},
        finish_within=3 * SECOND,
    )
    wait_for(lambda: _attention(slow) == "late", 30, "the schedule to need attention")
    # It finished its work; its success, late, is its last: the schedule recovers.
    wait_for(lambda: _attention(slow) == "", 30, "the schedule to recover")
    run = Run.objects.get(pk=made.pk)
    assert run.status == "succeeded" and run.late_at is not None
    assert run.finish_by < run.late_at < run.finished_at  # found late while it ran on
    assert _lines(notes) == [f"{run.pk} started", f"{run.pk} finished"]
    assert child.terminate() == 0


@pytest.mark.processes
def test_a_running_scheduler_finds_a_run_late_at_its_deadline_not_its_alert_interval(children):
    # Nothing claims the run (a planning process only) and the alert pass is an hour away:
    # only the wake-up just after its deadline finds it late within the test.
    child = children.start("--plan-only", settings={"ALERT_INTERVAL": 3600})
    schedule, made = run_when_ready(child, finish_within=2 * SECOND)
    found = Run.objects.filter(pk=made.pk, late_at__isnull=False)
    run = wait_for(found.first, 30, "the run to be found late")
    assert run.status == "pending" and run.late_at > run.finish_by
    assert _attention(schedule) == "late"  # judged in the same look
    assert child.terminate() == 0


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _attention(schedule: Schedule) -> str:
    schedule.refresh_from_db()
    return schedule.attention_reason
