"""django_periodic.signals: every run transition announced once it has committed.

These tests commit for real (transactional database): a signal sent inside the
transaction, or for one that rolls back, would be a bug they must see.
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_periodic import signals
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims, leases
from django_periodic.models import Run, Schedule
from django_periodic.testing import run_due
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import set_cursor

NAMES = {
    signals.run_planned: "planned",
    signals.run_started: "started",
    signals.run_finished: "finished",
    signals.run_retried: "retried",
    signals.run_skipped: "skipped",
    signals.lease_lost: "lease_lost",
    signals.schedule_disabled: "schedule_disabled",
}


class Received(list):
    """What the receiver got: (signal name, sender, arguments, in a transaction)."""

    def names(self) -> list[str]:
        return [name for name, *_ in self]

    def of(self, name: str) -> list[dict]:
        return [arguments for got, _sender, arguments, _atomic in self if got == name]


@pytest.fixture
def received():
    got = Received()

    def receiver(signal, sender, **arguments):
        got.append((NAMES[signal], sender, arguments, connection.in_atomic_block))

    for signal in NAMES:
        signal.connect(receiver, weak=False, dispatch_uid="test_signals")
    yield got
    for signal in NAMES:
        signal.disconnect(dispatch_uid="test_signals")


@pytest.mark.django_db(transaction=True)
def test_a_fire_that_succeeds_is_planned_started_and_finished_after_each_commit(received):
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    fire = schedule.next_fire_at
    (run,) = run_due(now=fire)
    assert received.names() == ["planned", "started", "finished"]
    assert all(sender is Run for _, sender, _, _ in received)
    assert not any(atomic for *_, atomic in received)
    planned, started, finished = (arguments for _, _, arguments, _ in received)
    common = {"run_id": run.pk, "schedule_id": schedule.pk, "schedule": schedule.name}
    common |= {"scope": "", "plan_time": fire, "using": "default"}
    assert planned == common | {"attempt": 0, "status": "pending", "reason": ""}
    assert type(planned["status"]) is str
    claimed_at = started.pop("started_at")
    assert started.pop("release_time") == fire  # no jitter: released at its plan time
    assert started == common | {"attempt": 1, "status": "running", "reason": ""}
    assert fire <= claimed_at <= run.started_at  # claimed, then the job started
    duration = finished.pop("duration")
    assert finished == common | {"attempt": 1, "status": "succeeded", "reason": ""}
    assert duration == run.duration


@pytest.mark.django_db(transaction=True)
def test_a_failed_attempt_with_attempts_left_is_retried_then_finished_failed(received):
    schedule = ScheduleFactory(job="tests.jobs.explode", max_attempts=2)
    (first,) = run_due(now=schedule.next_fire_at)
    (retried,) = received.of("retried")
    assert (retried["run_id"], retried["attempt"], retried["status"]) == (first.pk, 1, "retrying")
    assert retried["reason"] == "RuntimeError"
    run_due(now=Run.objects.get().next_retry_at)
    (finished,) = received.of("finished")
    assert (finished["attempt"], finished["status"], finished["reason"]) == (
        2,
        "failed",
        "RuntimeError",
    )


@pytest.mark.django_db(transaction=True)
def test_missed_fires_are_skipped_with_reason_missed(received):
    schedule = ScheduleFactory(interval=timedelta(minutes=1), misfire=Schedule.Misfire.SKIP)
    later = schedule.next_fire_at + timedelta(minutes=2, seconds=30)
    planner.plan_due(later)
    skipped = received.of("skipped")
    missed = Run.objects.filter(status="skipped", error_code="missed")
    assert len(skipped) == missed.count() >= 2
    assert {s["run_id"] for s in skipped} == set(missed.values_list("pk", flat=True))
    assert {(s["status"], s["reason"]) for s in skipped} == {("skipped", "missed")}


@pytest.mark.django_db(transaction=True)
def test_a_fire_while_the_last_run_still_runs_is_skipped_with_reason_overlap(received):
    schedule = ScheduleFactory(overlap=Schedule.Overlap.SKIP)
    fire = schedule.next_fire_at
    RunFactory(schedule=schedule, plan_time=fire - timedelta(minutes=1), status="running")
    planner.plan_due(fire)
    (skipped,) = received.of("skipped")
    assert (skipped["plan_time"], skipped["status"], skipped["reason"]) == (
        fire,
        "skipped",
        "overlap",
    )


@pytest.mark.django_db(transaction=True)
def test_run_now_sends_planned_once_committed(received):
    schedule = ScheduleFactory()
    with transaction.atomic():
        run = schedule.run_now()
        assert received == []  # not before the commit
    (planned,) = received.of("planned")
    assert (planned["run_id"], planned["status"]) == (run.pk, "pending")


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_for_a_transaction_that_rolls_back(received):
    schedule = ScheduleFactory()
    with pytest.raises(RuntimeError), transaction.atomic():
        schedule.run_now()
        planner.plan_due(schedule.next_fire_at)
        raise RuntimeError("rolled back")
    assert received == []
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_schedule_disabled_for_planning_failures_is_announced(received, settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 2}
    schedule = ScheduleFactory()
    Schedule.objects.filter(pk=schedule.pk).update(interval=None, cron="61 * * * *")
    planner.plan_due(schedule.next_fire_at)
    assert received.of("schedule_disabled") == []
    planner.plan_due(schedule.next_fire_at + timedelta(seconds=1))
    ((name, sender, arguments, _atomic),) = received
    assert (name, sender) == ("schedule_disabled", Schedule)
    assert (arguments["schedule_id"], arguments["schedule"]) == (schedule.pk, schedule.name)
    assert "minute" in arguments["error"]


@pytest.mark.django_db(transaction=True)
def test_a_schedule_disabled_for_a_job_no_process_has_is_announced(received, settings, now):
    """docs/signals.md: the other way the planner disables a schedule (UNKNOWN_JOB_GRACE)."""
    settings.DJANGO_PERIODIC = {"UNKNOWN_JOB_GRACE": 0}  # disabled at first sight
    SchedulerProcessFactory(started_at=now, jobs=["tests.jobs.noop"])
    schedule = ScheduleFactory(interval=timedelta(seconds=10), start_at=now)
    Schedule.objects.filter(pk=schedule.pk).update(job="tests.jobs.removed_from_code")
    set_cursor(schedule, now)
    assert planner.plan_due(now).disabled == [schedule.name]
    ((name, sender, arguments, _atomic),) = received
    assert (name, sender) == ("schedule_disabled", Schedule)
    assert (arguments["schedule_id"], arguments["schedule"]) == (schedule.pk, schedule.name)
    assert "UNKNOWN_JOB_GRACE" in arguments["error"]


@pytest.mark.django_db(transaction=True)
def test_an_expired_lease_is_lost_and_its_run_finished_failed(received, process, now):
    RunFactory(schedule=ScheduleFactory(lease_timeout=timedelta(seconds=5)), plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    leases.mark_started([claim.token])  # its job was called
    leases.sweep(now + timedelta(seconds=6))
    assert received.names() == ["started", "lease_lost", "finished"]
    lost, finished = received.of("lease_lost")[0], received.of("finished")[0]
    assert (lost["run_id"], lost["reentered"], lost["status"]) == (claim.run.pk, False, "failed")
    assert (finished["status"], finished["reason"]) == ("failed", "lease_expired")
    assert finished["duration"] == timedelta(seconds=6)


@pytest.mark.django_db(transaction=True)
def test_an_expired_lease_with_stale_reentry_is_lost_and_its_run_pending_again(
    received, process, now
):
    schedule = ScheduleFactory(lease_timeout=timedelta(seconds=5), allow_stale_reentry=True)
    RunFactory(schedule=schedule, plan_time=now)
    claims.claim(process, now, 1)
    leases.sweep(now + timedelta(seconds=6))
    (lost,) = received.of("lease_lost")
    assert (lost["reentered"], lost["status"]) == (True, "pending")
    assert received.of("finished") == []


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_start_deadline_is_skipped_when_claimed(received, process, now):
    run = RunFactory(plan_time=now - timedelta(minutes=5), start_deadline=now - timedelta(1))
    assert claims.claim(process, now, 1) == []
    (skipped,) = received.of("skipped")
    assert (skipped["run_id"], skipped["reason"]) == (run.pk, "start_deadline")


@pytest.mark.django_db(transaction=True)
def test_a_receiver_that_raises_is_logged_and_stops_nothing(received, caplog):
    def broken(**kwargs):
        raise ValueError("receiver bug")

    signals.run_planned.connect(broken, weak=False, dispatch_uid="broken")
    try:
        schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
        (run,) = run_due(now=schedule.next_fire_at)
    finally:
        signals.run_planned.disconnect(dispatch_uid="broken")
    assert run.status == "succeeded"
    assert received.names() == ["planned", "started", "finished"]
    assert any(r.exc_info and "receiver bug" in str(r.exc_info[1]) for r in caplog.records)
