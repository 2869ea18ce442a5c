"""Pausing a schedule with a reason until a time: its fires are not run, one skipped run
says so, and it goes on from its next fire after the pause (no catch-up)."""

import itertools
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import decisions, planner
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.policies import Occupancy
from tests.factories import ScheduleFactory, due_row
from tests.helpers import set_cursor
from tests.processes import wait_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
LIST_URL = reverse("admin:django_periodic_schedule_changelist")


# -- deciding, without the database ----------------------------------------------------------


def test_a_fire_during_the_pause_is_one_skipped_run_and_the_cursor_leaves_the_pause():
    until = T0 + timedelta(minutes=30, seconds=20)
    row = due_row(T0, paused_until=until, pause_reason="freeze", paused_by="ops")
    decision = decisions.decide(row, T0 + timedelta(minutes=5), Occupancy())
    (fire,) = decision.fires
    assert (fire.plan_time, fire.status, fire.error_code) == (T0, "skipped", ErrorCode.PAUSED)
    assert fire.error_message == "Paused until 2026-03-02 09:30:20 UTC by ops: freeze"
    assert decision.cursor == T0 + timedelta(minutes=31)  # the first fire after the pause


def test_a_fire_at_the_end_of_the_pause_runs():
    row = due_row(T0, next_fire_at=T0 + MINUTE, paused_until=T0 + MINUTE, pause_reason="freeze")
    decision = decisions.decide(row, T0 + MINUTE, Occupancy())
    assert [fire.status for fire in decision.fires] == ["pending"]


def test_a_paused_schedule_does_not_share_the_decision_of_its_unpaused_twin():
    paused = due_row(T0, pk=2, paused_until=T0 + timedelta(hours=1), pause_reason="freeze")
    found = decisions.decide_all([due_row(T0), paused], T0, {})
    assert [[fire.status for fire in decision.fires] for decision in found] == [
        ["pending"],
        ["skipped"],
    ]


# -- planning --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_planner_skips_the_pause_once_and_goes_on_after_it_without_catching_up():
    now = clock.now()
    schedule = ScheduleFactory(interval=MINUTE, start_at=now - timedelta(hours=1))
    set_cursor(schedule, now - timedelta(seconds=1))
    schedule.refresh_from_db()
    schedule.pause(now + timedelta(minutes=10), "database upgrade", by="ops")
    planner.plan_due(now)
    (skipped,) = Run.objects.filter(schedule=schedule)
    assert (skipped.status, skipped.error_code) == ("skipped", ErrorCode.PAUSED)
    assert "database upgrade" in skipped.error_message
    schedule.refresh_from_db()
    assert schedule.next_fire_at >= now + timedelta(minutes=10)
    planner.plan_due(now + timedelta(minutes=30))  # long after the pause: latest fire only
    runs = Run.objects.filter(schedule=schedule, status="pending")
    assert runs.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_pause_that_ended_leaves_the_schedule_to_run_as_before():
    now = clock.now()
    schedule = ScheduleFactory(interval=MINUTE)
    Schedule.objects.filter(pk=schedule.pk).update(
        paused_until=now - MINUTE, pause_reason="over", next_fire_at=now
    )
    planner.plan_due(now)
    assert list(Run.objects.values_list("status", flat=True)) == ["pending"]


# -- the model -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pausing_needs_a_future_end_and_a_reason_and_keeps_the_cursor():
    schedule = ScheduleFactory()
    cursor = schedule.next_fire_at
    with pytest.raises(ValidationError) as refused:
        schedule.pause(clock.now() - MINUTE, "  ")
    assert set(refused.value.message_dict) == {"paused_until", "pause_reason"}
    schedule.refresh_from_db()
    assert schedule.paused_until is None
    until = clock.now() + timedelta(hours=2)
    schedule.pause(until, "freeze", by="ops")
    schedule.refresh_from_db()
    assert (schedule.paused_until, schedule.pause_reason, schedule.paused_by) == (
        until,
        "freeze",
        "ops",
    )
    assert schedule.next_fire_at == cursor
    assert schedule.is_paused(clock.now())


@pytest.mark.django_db
def test_resuming_ends_the_pause_and_goes_on_from_now():
    schedule = ScheduleFactory(interval=timedelta(hours=1))
    set_cursor(schedule, clock.now() - timedelta(days=1))
    schedule.refresh_from_db()
    schedule.pause(clock.now() + timedelta(days=1), "freeze")
    schedule.resume()
    schedule.refresh_from_db()
    assert schedule.paused_until is None and schedule.pause_reason == ""
    assert schedule.next_fire_at > clock.now()  # no catch-up of the day missed


# -- the admin and periodic_status -----------------------------------------------------------


def local(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M:%S")


@pytest.mark.django_db
def test_the_admin_pauses_with_a_reason_logs_it_and_lists_it(admin_client):
    schedule = ScheduleFactory(name="reports")
    selected = {"action": "pause", "_selected_action": [schedule.pk]}
    form = admin_client.post(LIST_URL, {**selected, "index": "0"})
    assert 'id="pause-form"' in form.text
    until = (clock.now() + timedelta(days=1)).replace(microsecond=0)
    data = {**selected, "_pause_apply": "yes", "until": local(until), "reason": "freeze"}
    response = admin_client.post(LIST_URL, data, follow=True)
    assert "Paused 1 schedule." in response.text
    schedule.refresh_from_db()
    assert (schedule.paused_until, schedule.pause_reason, schedule.paused_by) == (
        until,
        "freeze",
        "admin",
    )
    (entry,) = LogEntry.objects.filter(object_id=str(schedule.pk))
    assert "freeze" in entry.get_change_message()
    assert "paused until" in admin_client.get(LIST_URL).text


@pytest.mark.django_db
def test_the_admin_refuses_a_pause_that_has_ended(admin_client):
    schedule = ScheduleFactory()
    data = {"action": "pause", "_selected_action": [schedule.pk], "_pause_apply": "yes",
            "until": local(clock.now() - MINUTE), "reason": "late"}  # fmt: skip
    response = admin_client.post(LIST_URL, data)
    assert "A pause ends in the future" in response.text
    schedule.refresh_from_db()
    assert schedule.paused_until is None


@pytest.mark.django_db
def test_the_admin_resumes_a_paused_schedule_and_logs_it(admin_client):
    schedule = ScheduleFactory()
    schedule.pause(clock.now() + timedelta(days=1), "freeze")
    data = {"action": "resume", "_selected_action": [schedule.pk]}
    response = admin_client.post(LIST_URL, data, follow=True)
    assert "Resumed 1 paused schedule." in response.text
    schedule.refresh_from_db()
    assert schedule.paused_until is None
    assert LogEntry.objects.filter(object_id=str(schedule.pk)).exists()


@pytest.mark.django_db
def test_periodic_status_lists_paused_schedules_with_who_why_and_until():
    ScheduleFactory(name="quiet").pause(clock.now() + timedelta(days=1), "freeze", by="ops")
    ScheduleFactory(name="busy")
    out = StringIO()
    call_command("periodic_status", stdout=out)
    after = out.getvalue().split("\nPaused\n", 1)[1].splitlines()
    rows = [line for line in itertools.takewhile(lambda line: line.startswith("  "), after)]
    assert len(rows) == 1
    assert "quiet" in rows[0] and "ops" in rows[0] and "freeze" in rows[0]


@pytest.mark.processes
def test_a_running_scheduler_skips_the_pause_once_and_goes_on_after_it(children):
    """A real run_scheduler: a schedule every second, paused for five seconds while it
    runs. A fire already planned ahead may still run (docs/semantics.md), then one skipped
    run stands for the pause, then it runs again from the pause's end: no catch-up."""
    child = children.start("--workers", "2")
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    schedule = ScheduleFactory(interval=timedelta(seconds=1), start_at=start)
    runs = Run.objects.filter(schedule=schedule)
    wait_for(lambda: runs.filter(status="succeeded").exists(), 30, "a run before the pause")
    paused_at = clock.now()
    until = paused_at.replace(microsecond=0) + timedelta(seconds=5)
    schedule.pause(until, "maintenance", by="tests")
    after = runs.filter(status="succeeded", plan_time__gte=until)
    wait_for(lambda: after.count() >= 2, 30, "runs after the pause")
    assert child.terminate() == 0
    (skipped,) = runs.filter(error_code=ErrorCode.PAUSED)
    assert skipped.status == "skipped" and paused_at < skipped.plan_time < until
    planned_ahead = paused_at + timedelta(seconds=2)  # PLAN_AHEAD is 1 s
    during = runs.filter(plan_time__gte=planned_ahead, plan_time__lt=until).exclude(pk=skipped.pk)
    assert list(during) == []
    first_after = runs.filter(plan_time__gte=until).order_by("plan_time").first()
    assert first_after.plan_time == until  # its next fire, not the ones it missed
