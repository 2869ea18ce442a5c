from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_periodic.conf import RANGES
from django_periodic.db import clock
from django_periodic.models import Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import output_of, overdue_schedule


@pytest.mark.django_db
def test_periodic_status_shows_schedulers_failures_and_broken_schedules(now):
    SchedulerProcess.objects.create(host="alive", pid=1, started_at=now, heartbeat_at=now)
    old = now - SchedulerProcess.stale_after() - timedelta(seconds=1)
    SchedulerProcess.objects.create(host="dead", pid=2, started_at=old, heartbeat_at=old)
    RunFactory(status="failed", error_code="ValueError", finished_at=now)
    broken = ScheduleFactory(name="broken")
    Schedule.objects.filter(pk=broken.pk).update(
        enabled=False, last_error="Cannot plan: bad", planning_failures=3
    )
    out = StringIO()
    with pytest.raises(CommandError, match=r"1 schedule\(s\) disabled by errors"):
        call_command("periodic_status", stdout=out)
    text = out.getvalue()  # the whole report comes before the verdict
    assert "alive:1  alive" in text
    assert "dead:2  STALE" in text
    assert "ValueError" in text
    assert "broken  DISABLED  3 failed ticks  Cannot plan: bad" in text


@pytest.mark.django_db
def test_prune_runs_deletes_only_old_finished_runs():
    now = clock.now()
    old_done = RunFactory(plan_time=now - timedelta(days=40), status="succeeded")
    old_active = RunFactory(plan_time=now - timedelta(days=40), status="retrying")
    recent = RunFactory(plan_time=now - timedelta(days=1), status="failed")
    output_of("prune_runs", days=30)
    assert set(Run.objects.values_list("pk", flat=True)) == {old_active.pk, recent.pk}
    assert not Run.objects.filter(pk=old_done.pk).exists()


@pytest.mark.django_db
def test_prune_runs_rejects_negative_days():
    with pytest.raises(CommandError, match=r"^--days must be at least 0\.$"):
        call_command("prune_runs", days=-1)


def test_run_scheduler_needs_a_worker_unless_planning_only():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("run_scheduler", workers=0)


# -- numbers past an option's range: a clear error, never a traceback ----------------------

HUGE = str(10**30)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--days", "99999999999"], "--days must be at most 36525."),
        (["--keep-runs", HUGE], "--keep-runs must be at most 1000000."),
        (["--batch-size", HUGE], "--batch-size must be at most 1000000."),
    ],
)
def test_prune_runs_refuses_a_number_past_its_options_range(db, options, message):
    old = RunFactory(plan_time=clock.now() - timedelta(days=400), status="succeeded")

    with pytest.raises(CommandError) as raised:
        call_command("prune_runs", *options)

    assert str(raised.value) == message
    assert Run.objects.filter(pk=old.pk).exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--workers", "100000"], "--workers must be at most 1000."),
        (["--metrics-port", "70000"], "--metrics-port must be at most 65535."),
        (["--metrics-port", "-1"], "--metrics-port must be at least 0."),
    ],
)
def test_run_scheduler_refuses_a_number_past_its_options_range(now, options, message):
    schedule = overdue_schedule(now)

    with pytest.raises(CommandError) as raised:
        call_command("run_scheduler", "--once", *options, verbosity=0)

    assert str(raised.value) == message
    assert not Run.objects.filter(schedule=schedule).exists()


def test_the_workers_option_has_the_workers_settings_range():
    most = RANGES["WORKERS"].high
    with pytest.raises(CommandError, match=rf"^--workers must be at most {most}\.$"):
        call_command("run_scheduler", workers=most + 1)


@pytest.mark.parametrize(
    ("since", "shown"),
    [
        ("99999999999d", "'99999999999d'"),  # past timedelta's range
        ("999999d", "'999999d'"),  # before the year 1
        (HUGE + "m", f"'{HUGE}m'"),
        ("1" * 5000 + "h", "'" + "1" * 37 + "...'"),  # more digits than int() reads
    ],
)
def test_an_explained_window_from_before_any_time_is_a_command_error(db, since, shown):
    ScheduleFactory(name="nightly")

    with pytest.raises(CommandError) as raised:
        output_of("periodic_status", "--explain", "nightly", "--since", since)

    assert str(raised.value) == (
        f"{shown} is too far back: no window starts before 1900-01-01 00:00 UTC."
    )
