"""Per-schedule alerts: a schedule needs attention when a fire goes ``alert_after`` without
a success, or after ``alert_failures`` failed runs in a row. The scheduler judges all of
them at once, stores the verdict on each, and announces each change once."""

import json
import threading
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic import signals
from django_periodic.checks import check_alert_mail, check_settings
from django_periodic.choices import AttentionReason, ErrorCode, RunTrigger
from django_periodic.db import clock
from django_periodic.engine.loop.scheduler import Scheduler, look_ahead
from django_periodic.engine.planning import attention
from django_periodic.models import Run, Schedule
from django_periodic.models.alerting import Facts, reason
from django_periodic.operations import alert_mail, health
from tests.factories import RunFactory, ScheduleFactory
from tests.legacy_mail import legacy_mail
from tests.processes import wait_for
from tests.threads import Thread

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
LIST_URL = reverse("admin:django_periodic_schedule_changelist")
FAILING, NO_SUCCESS = AttentionReason.FAILING, AttentionReason.NO_SUCCESS


def facts(**values) -> Facts:
    return Facts(**({"alert_after": None, "alert_failures": None} | values))


# -- the rules, without the database ---------------------------------------------------------


def test_failures_in_a_row_reach_the_threshold():
    assert reason(facts(alert_failures=3, oldest_unsucceeded=None, failures=2), T0) == ""
    assert reason(facts(alert_failures=3, oldest_unsucceeded=None, failures=3), T0) == FAILING


def test_a_fire_unsucceeded_for_longer_than_alert_after_needs_attention():
    just = facts(alert_after=HOUR, oldest_unsucceeded=T0 - HOUR, failures=0)
    assert reason(just, T0) == ""
    late = facts(alert_after=HOUR, oldest_unsucceeded=T0 - HOUR - timedelta(seconds=1), failures=0)
    assert reason(late, T0) == NO_SUCCESS


def test_failing_is_the_reason_when_both_hold_and_an_empty_field_is_no_rule():
    both = facts(alert_after=HOUR, alert_failures=1, oldest_unsucceeded=T0 - 2 * HOUR, failures=1)
    assert reason(both, T0) == FAILING
    assert reason(facts(oldest_unsucceeded=T0 - 100 * HOUR, failures=100), T0) == ""


# -- judging every schedule ------------------------------------------------------------------


@pytest.fixture
def received():
    got: list[tuple[str, dict]] = []
    names = {signals.schedule_needs_attention: "needs", signals.schedule_recovered: "recovered"}

    def receiver(signal, sender, **arguments):
        assert sender is Schedule
        got.append((names[signal], arguments))

    for signal in names:
        signal.connect(receiver, weak=False, dispatch_uid="test_alerts")
    yield got
    for signal in names:
        signal.disconnect(dispatch_uid="test_alerts")


def runs(schedule: Schedule, *statuses: str, start: datetime, step=timedelta(minutes=1), **kw):
    """Runs of ``schedule`` with these statuses, one per ``step`` from ``start``."""
    for n, status in enumerate(statuses):
        RunFactory(schedule=schedule, plan_time=start + n * step, status=status, **kw)


def state(schedule: Schedule) -> tuple[str, datetime | None]:
    schedule.refresh_from_db()
    return schedule.attention_reason, schedule.attention_since


@pytest.mark.django_db(transaction=True)
def test_failures_in_a_row_need_attention_once_and_a_success_recovers_once(received):
    now = clock.now()
    schedule = ScheduleFactory(name="nightly", alert_failures=2)
    runs(schedule, "succeeded", "failed", start=now - HOUR)
    attention.evaluate(now)
    assert state(schedule) == ("", None) and received == []

    runs(schedule, "failed", start=now - HOUR + timedelta(minutes=5))
    attention.evaluate(now)
    attention.evaluate(now + timedelta(minutes=1))  # still so: nothing new to announce
    assert state(schedule) == (FAILING, now)
    ((name, arguments),) = received
    assert name == "needs" and type(arguments["reason"]) is str  # not an AttentionReason
    assert arguments == {
        "schedule_id": schedule.pk,
        "schedule": "nightly",
        "reason": "failing",
        "message": "its last 2 run(s) failed",
        "since": now,
        "using": "default",
    }

    runs(schedule, "succeeded", start=now - HOUR + timedelta(minutes=6))
    attention.evaluate(now + timedelta(minutes=2))
    attention.evaluate(now + timedelta(minutes=3))
    assert state(schedule) == ("", None)
    assert [name for name, _ in received] == ["needs", "recovered"]
    assert received[1][1]["reason"] == "failing" and received[1][1]["since"] == now


@pytest.mark.django_db(transaction=True)
def test_cancelled_and_skipped_runs_neither_count_nor_end_a_streak(received):
    now = clock.now()
    schedule = ScheduleFactory(alert_failures=2)
    runs(schedule, "failed", "cancelled", "skipped", "failed", start=now - HOUR)
    attention.evaluate(now)
    assert state(schedule)[0] == FAILING


@pytest.mark.django_db(transaction=True)
def test_a_fire_without_a_success_for_alert_after_needs_attention(received):
    now = clock.now()
    schedule = ScheduleFactory(alert_after=HOUR)
    runs(schedule, "succeeded", start=now - 3 * HOUR)
    # Still running since 61 minutes ago; a manual run, or a fire skipped by a pause or on a
    # closed day, older still, is no expected fire.
    runs(schedule, "running", start=now - HOUR - timedelta(minutes=1))
    runs(schedule, "failed", start=now - 2 * HOUR, trigger=RunTrigger.MANUAL)
    runs(schedule, "skipped", start=now - 2 * HOUR + timedelta(seconds=1))
    Run.objects.filter(status="skipped").update(error_code=ErrorCode.PAUSED)
    runs(schedule, "skipped", start=now - 2 * HOUR + timedelta(seconds=2))
    Run.objects.filter(status="skipped", error_code="").update(error_code=ErrorCode.CLOSED)
    attention.evaluate(now - timedelta(minutes=2))
    assert state(schedule)[0] == ""
    attention.evaluate(now)
    assert state(schedule)[0] == NO_SUCCESS
    assert received[0][1]["message"] == "a fire has gone without a success for over 1 hour"


@pytest.mark.django_db(transaction=True)
def test_a_skipped_fire_missed_in_a_downtime_counts_as_a_fire_without_success(received):
    now = clock.now()
    schedule = ScheduleFactory(alert_after=HOUR)
    runs(schedule, "skipped", start=now - 2 * HOUR)
    Run.objects.update(error_code=ErrorCode.MISSED)
    attention.evaluate(now)
    assert state(schedule)[0] == NO_SUCCESS


@pytest.mark.django_db(transaction=True)
def test_disabling_or_removing_the_alerts_ends_the_attention_with_one_signal(received):
    now = clock.now()
    disabled = ScheduleFactory(name="disabled", alert_failures=1)
    removed = ScheduleFactory(name="removed", alert_failures=1)
    for schedule in (disabled, removed):
        runs(schedule, "failed", start=now - HOUR)
    attention.evaluate(now)
    assert [name for name, _ in received] == ["needs", "needs"]
    Schedule.objects.filter(pk=disabled.pk).update(enabled=False)
    Schedule.objects.filter(pk=removed.pk).update(alert_failures=None)
    attention.evaluate(now)
    attention.evaluate(now)
    assert [name for name, _ in received] == ["needs", "needs", "recovered", "recovered"]
    assert Schedule.objects.needing_attention().count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_change_of_reason_is_written_and_not_announced_again(received):
    now = clock.now()
    schedule = ScheduleFactory(alert_after=HOUR, alert_failures=2)
    runs(schedule, "failed", start=now - 2 * HOUR)
    attention.evaluate(now)
    assert state(schedule) == (NO_SUCCESS, now)
    runs(schedule, "failed", start=now - HOUR)
    attention.evaluate(now + timedelta(minutes=1))
    assert state(schedule) == (FAILING, now)  # since when it began to need attention
    assert [name for name, _ in received] == ["needs"]


def queries_of_evaluate(now) -> int:
    with CaptureQueriesContext(connection) as captured:
        attention.evaluate(now)
    return len(captured.captured_queries)


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_costs_the_same_queries_however_many_schedules_change():
    now = clock.now()
    few = [ScheduleFactory(alert_failures=1)]
    runs(few[0], "failed", start=now - HOUR)
    baseline = queries_of_evaluate(now)
    many = ScheduleFactory.create_batch(20, alert_failures=1)
    for schedule in many:
        runs(schedule, "failed", start=now - HOUR)
    ScheduleFactory.create_batch(5, alert_after=HOUR)  # fine
    Schedule.objects.filter(pk=few[0].pk).update(attention_reason="")
    assert queries_of_evaluate(now) == baseline
    assert Schedule.objects.needing_attention().count() == 21
    assert queries_of_evaluate(now) == 1  # nothing changed: the one query that judges


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_judges_at_most_once_an_alert_interval(received):
    """The loop ticks far more often than ALERT_INTERVAL: its housekeeping judges at the
    ``now`` it is given, then neither queries nor judges again until the interval has
    passed, so a change in between waits for the next evaluation."""
    housekeeper = Scheduler(workers=0).housekeeper
    interval = housekeeper.settings.ALERT_INTERVAL
    now = clock.now()
    schedule = ScheduleFactory(alert_failures=1)
    ahead = look_ahead()  # no run has a deadline: only the interval says when

    def attend(at: datetime) -> tuple[attention.Evaluation | None, int]:
        """What it found, and its queries (not counting the transaction's own statements:
        in a tick, the evaluation is a savepoint in the tick's transaction)."""
        with CaptureQueriesContext(connection) as captured:
            found = housekeeper.attend(at, ahead)
        control = ("BEGIN", "COMMIT")
        queries = [q for q in captured.captured_queries if q["sql"].split()[0] not in control]
        return found, len(queries)

    found, queries = attend(now)
    # Two: the deadline watcher's probe (engine/runs/deadlines.py), then the judging.
    assert found is not None and (found.watched, found.changes, queries) == (1, [], 2)
    runs(schedule, "failed", start=now - HOUR)  # it needs attention from now on
    for at in (now, now + interval / 2, now + interval - timedelta(microseconds=1)):
        assert attend(at) == (None, 0)  # too soon: not judged, not one query
    assert state(schedule) == ("", None) and received == []

    found, _ = attend(now + interval)
    assert found is not None and [change.reason for change in found.changes] == [FAILING]
    assert state(schedule) == (FAILING, now + interval)
    assert [name for name, _ in received] == ["needs"]
    assert attend(now + interval + timedelta(seconds=1)) == (None, 0)
    assert housekeeper.next_attention == now + 2 * interval


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_judging_at_once_announce_each_change_once(postgres, received):
    now = clock.now()
    schedules = ScheduleFactory.create_batch(30, alert_failures=1)
    for schedule in schedules:
        runs(schedule, "failed", start=now - HOUR)
    barrier = threading.Barrier(4)

    def judge():
        barrier.wait(timeout=10)
        for _ in range(5):
            attention.evaluate(now)

    judges = [Thread(target=judge) for _ in range(4)]
    for thread in judges:
        thread.start()
    for thread in judges:
        thread.join(timeout=60)
    announced = sorted(arguments["schedule_id"] for _, arguments in received)
    assert announced == sorted(s.pk for s in schedules)


# -- the row: validation, constraints, saving ------------------------------------------------


@pytest.mark.django_db
def test_clean_refuses_alerts_out_of_their_range():
    schedule = ScheduleFactory.build(alert_after=timedelta(0), alert_failures=0)
    with pytest.raises(ValidationError) as refused:
        schedule.full_clean()
    assert set(refused.value.message_dict) == {"alert_after", "alert_failures"}
    ScheduleFactory.build(name="fine", alert_after=HOUR, alert_failures=3).full_clean()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "values", [{"alert_after": timedelta(seconds=-1)}, {"alert_failures": 1001}]
)
def test_the_database_refuses_alerts_out_of_range_written_past_clean(values):
    schedule = ScheduleFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(**values)


@pytest.mark.django_db(transaction=True)
def test_an_unknown_reason_written_by_hand_is_judged_again_and_the_others_go_on(received):
    now = clock.now()
    odd = ScheduleFactory(name="odd", alert_failures=1)
    failing = ScheduleFactory(name="failing", alert_failures=1)
    runs(failing, "failed", start=now - HOUR)
    Schedule.objects.filter(pk=odd.pk).update(attention_reason="gremlins", attention_since=now)
    attention.evaluate(now)
    assert state(odd) == ("", None)
    assert state(failing)[0] == FAILING
    assert sorted((name, a["schedule"], a["reason"]) for name, a in received) == [
        ("needs", "failing", "failing"),
        ("recovered", "odd", "gremlins"),
    ]


@pytest.mark.django_db
def test_an_edit_saved_from_a_stale_instance_keeps_the_schedulers_verdict(now):
    schedule = ScheduleFactory(alert_failures=1)
    stale = Schedule.objects.get(pk=schedule.pk)
    Schedule.objects.filter(pk=schedule.pk).update(attention_reason=FAILING, attention_since=now)
    stale.max_attempts = 3
    stale.save()
    assert state(schedule) == (FAILING, now)
    assert schedule.max_attempts == 3


# -- where it shows ----------------------------------------------------------------------------


def needing(now, name="nightly", **fields) -> Schedule:
    schedule = ScheduleFactory(name=name, alert_failures=3, **fields)
    Schedule.objects.filter(pk=schedule.pk).update(attention_reason=FAILING, attention_since=now)
    return schedule


@pytest.mark.django_db
def test_the_admin_lists_the_reason_and_filters_the_schedules_needing_attention(admin_client):
    now = clock.now()
    needing(now)
    ScheduleFactory(name="calm-one")
    page = admin_client.get(LIST_URL)
    assert "its last 3 run(s) failed" in page.text and "calm-one" in page.text
    only = admin_client.get(LIST_URL, {"attention": "yes"})
    assert "nightly" in only.text and "calm-one" not in only.text
    fine = admin_client.get(LIST_URL, {"attention": "no"})
    assert "calm-one" in fine.text and "nightly" not in fine.text


@pytest.mark.django_db
def test_the_admin_form_saves_alerts_and_refuses_them_out_of_range(admin_client):
    schedule = ScheduleFactory(name="edited")
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    page = admin_client.get(url)
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {k: ("" if v is None else v) for k, v in data.items()}
    data.update(alert_after="02:00:00", alert_failures="0", kind="interval")
    refused = admin_client.post(url, data)
    assert refused.status_code == 200
    assert "alert_failures" in refused.context["adminform"].form.errors
    data["alert_failures"] = "3"
    saved = admin_client.post(url, data)
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert (schedule.alert_after, schedule.alert_failures) == (2 * HOUR, 3)


@pytest.mark.django_db
def test_periodic_status_exits_1_naming_the_schedules_needing_attention(now):
    needing(now)
    out = StringIO()
    with pytest.raises(CommandError, match="need attention: nightly") as failed:
        call_command("periodic_status", stdout=out)
    assert failed.value.returncode == 1
    assert "Needing attention" in out.getvalue() and "its last 3 run(s) failed" in out.getvalue()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("periodic_status", json=True, stdout=out)
    data = json.loads(out.getvalue())
    assert [row["name"] for row in data["needing_attention"]] == ["nightly"]
    assert data["problems"][-1] == {
        "check": health.SCHEDULES_NEED_ATTENTION,
        "message": "schedule(s) need attention: nightly",
    }


@pytest.mark.django_db
def test_the_health_view_is_503_counting_them(client, now):
    # Named only to a user allowed to view schedules (tests/test_leaks.py).
    needing(now)
    response = client.get("/periodic/health/")
    assert response.status_code == 503
    assert response.json()["problems"] == [
        {"check": "schedules_need_attention", "message": "1 schedule(s) need attention"}
    ]


@legacy_mail
@pytest.mark.django_db(transaction=True)
def test_changes_are_mailed_to_the_admins_when_asked(settings, mailoutbox):
    settings.ADMINS = [("Ops", "ops@example.com")]
    now = clock.now()
    schedule = ScheduleFactory(name="nightly", alert_failures=1)
    runs(schedule, "failed", start=now - HOUR)
    attention.evaluate(now)
    assert alert_mail.outbox.flush(timeout=30)
    assert mailoutbox == []  # off by default
    Schedule.objects.update(attention_reason="")
    settings.DJANGO_PERIODIC = {"ALERT_MAIL_ADMINS": True}
    attention.evaluate(now)
    # Mailed by the outbox's thread, not the one that judged (tests/test_alert_mail_sender.py).
    assert alert_mail.outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert "Schedule 'nightly' needs attention: its last 1 run(s) failed" in mail.subject
    assert mail.to == ["ops@example.com"]


@pytest.mark.django_db(transaction=True)  # a scrape closes its connection
def test_the_metrics_show_a_series_per_schedule_only_when_asked(settings):
    from django_periodic.operations.metrics import _StateCollector

    needing(clock.now())
    ScheduleFactory(name="quiet", alert_after=HOUR)
    ScheduleFactory(name="unwatched")

    def samples():
        found = {}
        for family in _StateCollector("default").collect():
            for sample in family.samples:
                found[(sample.name, tuple(sample.labels.values()))] = sample.value
        return found

    assert samples()[("django_periodic_schedules_needing_attention", ())] == 1
    assert not any(name == "django_periodic_schedule_needs_attention" for name, _ in samples())
    settings.DJANGO_PERIODIC = {"METRICS_SCHEDULE_LABELS": True}
    per_schedule = {
        labels: value
        for (name, labels), value in samples().items()
        if name == "django_periodic_schedule_needs_attention"
    }
    assert per_schedule == {("nightly",): 1, ("quiet",): 0}


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"ALERT_INTERVAL": 60, "ALERT_MAIL_ADMINS": True, "METRICS_SCHEDULE_LABELS": False}, []),
        ({"ALERT_INTERVAL": 0.5}, ["django_periodic.E007"]),
        ({"ALERT_INTERVAL": 0}, ["django_periodic.E003"]),
        ({"ALERT_MAIL_ADMINS": "yes"}, ["django_periodic.E003"]),
        ({"METRICS_SCHEDULE_LABELS": 1}, ["django_periodic.E003"]),
    ],
)
def test_the_alert_settings_are_checked(settings, value, expected):
    settings.DJANGO_PERIODIC = value
    assert [error.id for error in check_settings()] == expected


def test_mailing_the_admins_without_any_is_a_warning(settings):
    settings.DJANGO_PERIODIC = {"ALERT_MAIL_ADMINS": True}
    settings.ADMINS = []
    assert [warning.id for warning in check_alert_mail()] == ["django_periodic.W003"]
    settings.ADMINS = [("Ops", "ops@example.com")]
    assert check_alert_mail() == []


# -- a real scheduler --------------------------------------------------------------------------


@pytest.mark.processes
def test_a_running_scheduler_announces_each_change_once(children):
    schedule = ScheduleFactory(
        name="flaky", job="tests.jobs.explode", interval=timedelta(seconds=1), alert_failures=2
    )
    child = children.start("--workers=1", settings={"ALERT_INTERVAL": 1})
    wait_for(lambda: state(schedule)[0] == FAILING, 30, "the schedule to need attention")
    # Fixed: the next fire succeeds, and the scheduler finds it recovered.
    schedule.refresh_from_db()
    schedule.job = "tests.jobs.noop"
    schedule.save()
    wait_for(lambda: state(schedule)[0] == "", 30, "the schedule to recover")
    # Some more evaluations (one a second): none announces anything.
    later = clock.now() + timedelta(seconds=3)
    succeeded = Run.objects.filter(schedule=schedule, status="succeeded", finished_at__gt=later)
    wait_for(succeeded.exists, 30, "more successful fires")
    assert child.terminate() == 0
    output = child.output()
    assert output.count("Schedule 'flaky' needs attention: its last 2 run(s) failed.") == 1
    assert output.count("Schedule 'flaky' recovered") == 1
