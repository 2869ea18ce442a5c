"""Sentry Crons (django_periodic.contrib.sentry): a monitor per schedule, check-ins per run,
through the real sentry-sdk.

The oracle is what Sentry would receive: the check-in items of the envelopes sentry-sdk
hands its transport (tests.sentry_transport), compared with the runs' own rows. The runs
commit for real (transactional database): check-ins follow the signals sent after commit.
"""

import sys
import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core import checks as django_checks
from django.db.backends.signals import connection_created

from django_periodic import signals
from django_periodic.contrib import sentry
from django_periodic.contrib.sentry import monitors
from django_periodic.db import clock
from django_periodic.engine.runs import claims, deadlines, leases
from django_periodic.models import Calendar, Run, Schedule
from django_periodic.testing import run_due
from tests import ledger, sentry_transport
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory

pytestmark = pytest.mark.django_db(transaction=True)

UID = "django_periodic.contrib.sentry"


@pytest.fixture
def transport():
    """sentry-sdk initialised with a transport that captures envelopes."""
    captured = sentry_transport.CapturingTransport()
    sentry_transport.start(captured)
    yield captured
    captured.open.set()
    sentry.flush(10)
    sentry_transport.stop()


@pytest.fixture
def crons(settings, transport):
    """SENTRY_CRONS on (override: setting_changed connects the receivers)."""
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "SENTRY_CRONS": True}
    return transport


def sent(transport) -> list[dict]:
    """The check-ins Sentry received once every queued one was sent."""
    assert sentry.flush(30), "check-ins still queued after 30 s"
    return list(transport.check_ins)


def by_attempt(check_ins: list[dict]) -> dict[str, list[str]]:
    """Statuses by check-in id, in the order sent."""
    found: dict[str, list[str]] = {}
    for check_in in check_ins:
        found.setdefault(check_in["check_in_id"], []).append(check_in["status"])
    return found


def connected() -> bool:
    return any(key[0] == UID for signal in signals.RUN_SIGNALS for key, *_ in signal.receivers)


# -- on and off ------------------------------------------------------------------------------


def test_off_no_receiver_is_connected_and_nothing_is_sent(transport):
    assert not connected()
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    (run,) = run_due(now=schedule.next_fire_at)
    assert run.status == "succeeded"
    assert sent(transport) == []


def test_switching_the_setting_connects_and_disconnects_the_receivers(settings):
    assert not connected()
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "SENTRY_CRONS": True}
    assert connected()
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "SENTRY_CRONS": False}
    assert not connected()


def test_on_without_sentry_sdk_is_a_system_check_error(settings, monkeypatch):
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "SENTRY_CRONS": True}
    monkeypatch.setitem(sys.modules, "sentry_sdk", None)  # not importable
    errors = [e for e in django_checks.run_checks() if e.id == "django_periodic.E011"]
    assert len(errors) == 1
    assert "django-periodic[sentry]" in errors[0].msg


def test_on_with_sentry_sdk_passes_the_check(settings):
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "SENTRY_CRONS": True}
    assert not [e for e in django_checks.run_checks() if e.id == "django_periodic.E011"]


# -- a run's check-ins -----------------------------------------------------------------------


def test_a_run_that_succeeds_is_in_progress_then_ok_with_its_duration_and_monitor(crons):
    schedule = ScheduleFactory(
        name="nightly-report",
        job="tests.jobs.add",
        args=[1, 2],
        interval=None,
        cron="*/5 * * * *",
        timezone="Europe/Berlin",
        misfire_grace=timedelta(seconds=90),
        timeout=timedelta(minutes=2),
        alert_failures=3,
    )
    (run,) = run_due(now=schedule.next_fire_at)
    assert run.status == "succeeded"
    started, ended = sent(crons)
    assert (started["status"], ended["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == ended["check_in_id"]
    assert ended["duration"] == pytest.approx(run.duration.total_seconds())
    for check_in in (started, ended):
        assert check_in["monitor_slug"] == "nightly-report"
        assert check_in["monitor_config"] == {
            "schedule": {"type": "crontab", "value": "*/5 * * * *"},
            "timezone": "Europe/Berlin",
            "checkin_margin": 2,  # 90 s, in whole minutes
            "max_runtime": 2,
            "failure_issue_threshold": 3,
            "recovery_threshold": 1,
        }


def test_a_run_that_fails_ends_in_error(crons):
    schedule = ScheduleFactory(job="tests.jobs.explode")
    (run,) = run_due(now=schedule.next_fire_at)
    assert run.status == "failed"
    assert list(by_attempt(sent(crons)).values()) == [["in_progress", "error"]]


def test_a_retried_attempt_ends_in_error_and_the_next_attempt_is_a_new_check_in(crons):
    schedule = ScheduleFactory(job="tests.jobs.explode", max_attempts=2)
    (first,) = run_due(now=schedule.next_fire_at)
    assert first.status == "retrying"
    (second,) = run_due(now=first.next_retry_at)
    assert (second.pk, second.status, second.attempt) == (first.pk, "failed", 2)
    attempts = by_attempt(sent(crons))
    assert list(attempts.values()) == [["in_progress", "error"], ["in_progress", "error"]]


def test_a_lease_lost_to_a_dead_process_is_ended_by_the_sweeper(crons, now):
    dead = SchedulerProcessFactory()
    RunFactory(schedule=ScheduleFactory(lease_timeout=timedelta(seconds=5)), plan_time=now)
    (claim,) = claims.claim(dead, now, 1)
    leases.mark_started([claim.token])  # its job was called, then its process died
    leases.sweep(now + timedelta(seconds=6))
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.error_code) == ("failed", "lease_expired")
    started, ended = sent(crons)
    assert (started["status"], ended["status"]) == ("in_progress", "error")
    assert started["check_in_id"] == ended["check_in_id"]
    assert ended["duration"] == pytest.approx(6.0)


def test_a_lease_lost_and_run_again_ends_the_lost_attempt_and_starts_another(crons, now):
    process = SchedulerProcessFactory()
    schedule = ScheduleFactory(lease_timeout=timedelta(seconds=5), allow_stale_reentry=True)
    RunFactory(schedule=schedule, plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    leases.mark_started([claim.token])
    leases.sweep(now + timedelta(seconds=6))
    assert Run.objects.get(pk=claim.run.pk).status == "pending"
    (again,) = run_due(now=now + timedelta(seconds=7))
    assert (again.status, again.attempt) == ("succeeded", 2)
    attempts = by_attempt(sent(crons))
    assert list(attempts.values()) == [["in_progress", "error"], ["in_progress", "ok"]]


def test_a_run_claimed_ahead_that_waited_past_its_start_deadline_ends_its_check_in(crons, now):
    schedule = ScheduleFactory(misfire_grace=timedelta(seconds=1))
    RunFactory(schedule=schedule, plan_time=now, start_deadline=now + timedelta(seconds=1))
    (claim,) = claims.claim(SchedulerProcessFactory(), now, 1)
    waited = replace(claim, claimed_at=claim.claimed_at - 5)  # a prefetched claim, 5 s later
    assert ledger.execute(waited) == "skipped"
    started, ended = sent(crons)
    assert (started["status"], ended["status"]) == ("in_progress", "error")
    assert started["check_in_id"] == ended["check_in_id"]


def test_a_fire_skipped_before_it_started_sends_nothing(crons):
    schedule = ScheduleFactory(
        job="tests.jobs.noop", misfire="skip", misfire_grace=timedelta(seconds=10)
    )
    runs = run_due(now=schedule.next_fire_at + timedelta(hours=1, seconds=30))  # long missed
    assert runs == []
    assert Run.objects.filter(status="skipped").exists()
    assert sent(crons) == []


# -- monitors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "schedule"),
    [
        (timedelta(minutes=1), {"type": "interval", "value": 1, "unit": "minute"}),
        (timedelta(minutes=90), {"type": "interval", "value": 90, "unit": "minute"}),
        (timedelta(hours=6), {"type": "interval", "value": 6, "unit": "hour"}),
        (timedelta(days=2), {"type": "interval", "value": 2, "unit": "day"}),
        (timedelta(weeks=2), {"type": "interval", "value": 2, "unit": "week"}),
    ],
)
def test_an_interval_schedule_has_an_interval_monitor(crons, interval, schedule):
    ScheduleFactory(job="tests.jobs.noop", interval=interval, timezone="UTC")
    run_due(now=Schedule.objects.get().next_fire_at)
    configs = [c["monitor_config"] for c in sent(crons)]
    assert configs == 2 * [{"schedule": schedule, "timezone": "UTC", "checkin_margin": 1}]


@pytest.mark.parametrize("seconds", [30, 90], ids=["under-a-minute", "not-whole-minutes"])
def test_an_interval_sentry_cannot_express_sends_check_ins_without_a_config(crons, seconds):
    schedule = ScheduleFactory(job="tests.jobs.noop", interval=timedelta(seconds=seconds))
    run_due(now=schedule.next_fire_at)
    check_ins = sent(crons)
    assert [c["status"] for c in check_ins] == ["in_progress", "ok"]
    assert not any("monitor_config" in c for c in check_ins)


def test_cron_macros_are_sent_as_their_five_fields(crons):
    schedule = ScheduleFactory(job="tests.jobs.noop", interval=None, cron="@hourly")
    run_due(now=schedule.next_fire_at)
    values = {c["monitor_config"]["schedule"]["value"] for c in sent(crons)}
    assert values == {"0 * * * *"}


def test_jitter_widens_the_check_in_margin():
    fields = {f: getattr(Schedule(interval=timedelta(hours=1)), f) for f in monitors.FIELDS}
    fields |= {"misfire_grace": timedelta(seconds=30), "jitter": timedelta(minutes=5)}
    assert monitors.config_of(fields)["checkin_margin"] == 6


def test_margins_and_thresholds_stay_within_what_sentry_accepts():
    fields = {f: getattr(Schedule(interval=timedelta(hours=1)), f) for f in monitors.FIELDS}
    fields |= {"timeout": timedelta(days=60), "alert_failures": 5000}
    fields |= {"misfire_grace": timedelta(days=60)}
    config = monitors.config_of(fields)
    assert (config["checkin_margin"], config["max_runtime"]) == (40_320, 40_320)
    assert config["failure_issue_threshold"] == 720


def test_rrule_and_one_shot_schedules_have_no_config():
    rrule = Schedule(interval=None, rrule="FREQ=DAILY;BYHOUR=9", start_at=clock.wall_now())
    once = Schedule(interval=None, run_at=clock.wall_now())
    for schedule in (rrule, once):
        assert monitors.config_of({f: getattr(schedule, f) for f in monitors.FIELDS}) is None


def test_a_schedule_with_calendars_has_no_config():
    closed = ScheduleFactory(interval=timedelta(hours=1))
    closed.calendars.add(Calendar.objects.create(name="weekends", closed_weekdays=[5, 6]))
    open_ = ScheduleFactory(interval=timedelta(hours=1))
    assert sentry.monitor_config(closed) is None
    hourly = {"type": "interval", "value": 1, "unit": "hour"}
    assert sentry.monitor_config(open_)["schedule"] == hourly


@pytest.mark.parametrize(
    "name", ["nightly-report", "billing_sync", "a" * 50], ids=["dashes", "underscore", "fifty"]
)
def test_a_name_that_is_a_slug_is_its_own_slug(name):
    assert sentry.monitor_slug(name) == name


def test_other_names_get_a_readable_slug_with_a_hash_that_keeps_them_apart():
    pairs = [
        ("Nightly Report", "nightly-report"),  # would slugify alike
        ("billing.sync", "billing/sync"),
        ("x" * 60 + "-one", "x" * 60 + "-two"),  # alike in their first 50 characters
        ("日次", "週次"),  # nothing left of them once slugified
    ]
    for first, second in pairs:
        slugs = sentry.monitor_slug(first), sentry.monitor_slug(second)
        assert slugs[0] != slugs[1]
        assert all(len(slug) <= 50 for slug in slugs)
        assert all(slug == slug.lower() and " " not in slug and "." not in slug for slug in slugs)
    assert sentry.monitor_slug("billing.sync").startswith("billing-sync-")
    assert sentry.monitor_slug("日次").startswith("schedule-")


# -- fan-out, hang ---------------------------------------------------------------------------


def test_a_fanned_out_fire_is_one_monitor_with_a_check_in_per_scope(crons):
    schedule = ScheduleFactory(job="tests.jobs.noop", scopes="tests.jobs.tenants")
    runs = run_due(now=schedule.next_fire_at)
    assert len({run.scope for run in runs}) == len(runs) == 3
    check_ins = sent(crons)
    assert {c["monitor_slug"] for c in check_ins} == {schedule.name}
    attempts = by_attempt(check_ins)
    assert len(attempts) == 3
    assert all(statuses == ["in_progress", "ok"] for statuses in attempts.values())


def test_a_sentry_that_hangs_never_holds_up_the_runs(crons):
    crons.open.clear()  # every envelope waits
    schedules = [ScheduleFactory(job="tests.jobs.add", args=[1, n]) for n in range(3)]
    done: list[Run] = []
    worker = threading.Thread(
        target=lambda: done.extend(run_due(now=max(s.next_fire_at for s in schedules)))
    )
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the runs waited for Sentry"
    assert sorted(run.result for run in done) == [1, 2, 3]  # each job's own row
    assert crons.check_ins == []
    crons.open.set()
    assert len(sent(crons)) == 6


def test_the_configs_of_a_burst_of_runs_are_read_together(crons):
    opened: list[str] = []

    def count(sender, connection, **kwargs):
        opened.append(threading.current_thread().name)

    schedules = [ScheduleFactory(job="tests.jobs.noop") for _ in range(20)]
    connection_created.connect(count, dispatch_uid="test_sentry_crons")
    try:
        crons.open.clear()  # the sender's thread waits at its first check-in
        runs = run_due(now=max(s.next_fire_at for s in schedules))
        crons.open.set()
        assert len(sent(crons)) == 2 * len(runs) == 40
    finally:
        connection_created.disconnect(dispatch_uid="test_sentry_crons")
    # The sender's thread opens a connection for each read, and closes it after: one read
    # for the first check-in, one for all the others queued meanwhile (not one per schedule).
    assert 1 <= opened.count("django_periodic.Sentry check-ins") <= 2


def test_a_late_run_checks_in_error_once_for_its_attempt(crons):
    schedule = ScheduleFactory(finish_within=timedelta(minutes=10))
    now = clock.now()
    run = RunFactory(
        schedule=schedule,
        plan_time=now - timedelta(hours=1),
        finish_by=now - timedelta(minutes=50),
        status="retrying",
        attempt=1,
    )
    deadlines.flag_late(now)
    deadlines.flag_late(now)  # found once
    (check_in,) = sent(crons)
    assert check_in["status"] == "error"
    assert check_in["check_in_id"] == sentry.checkins.check_in_id(run.pk, 1)
