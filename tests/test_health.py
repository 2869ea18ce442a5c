"""operations.health: each check's trigger and non-trigger, the report's sections and fire
lag, its constant cost; periodic_status's outputs and exit statuses; the health view and the
django-health-check check."""

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.conf import get_settings
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from django_periodic.operations import health
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import overdue_schedule, set_cursor


def checks(now) -> set[str]:
    return {problem.check for problem in health.attention(now)}


def dead_process(now) -> SchedulerProcess:
    silent = now - SchedulerProcess.stale_after() - timedelta(seconds=1)
    return SchedulerProcessFactory(host="dead", pid=2, started_at=silent, heartbeat_at=silent)


def running_run(now, expires_at, holder: str = "test:1", **fields) -> Run:
    """A running run holding an unreleased lease that expires at ``expires_at``."""
    run = RunFactory(status="running", attempt=1, started_at=now, **fields)
    Lease.objects.create(
        run=run,
        attempt=1,
        holder=holder,
        acquired_at=now - timedelta(seconds=30),
        heartbeat_at=now - timedelta(seconds=30),
        expires_at=expires_at,
    )
    return run


def disabled_by_error(name: str = "broken") -> Schedule:
    schedule = ScheduleFactory(name=name)
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False, last_error="Cannot plan: bad")
    return schedule


def started_run(now, lag: timedelta, attempt: int = 1) -> Run:
    started = now - timedelta(minutes=5)
    return RunFactory(
        status="succeeded", attempt=attempt, plan_time=started - lag, started_at=started
    )


def status(*args, **options) -> str:
    out = StringIO()
    call_command("periodic_status", *args, stdout=out, **options)
    return out.getvalue()


# -- the checks ------------------------------------------------------------------------------


def test_nothing_needs_attention_in_an_empty_database(now):
    assert health.attention(now) == []


def test_overdue_schedules_without_a_live_scheduler_need_attention(now):
    overdue_schedule(now)
    dead_process(now)
    assert checks(now) == {health.NO_LIVE_SCHEDULER}


def test_overdue_schedules_with_a_live_scheduler_are_fine(now, process):
    overdue_schedule(now)
    assert checks(now) == set()


def test_no_scheduler_is_fine_while_nothing_is_overdue(now):
    schedule = ScheduleFactory()
    just_due = now - SchedulerProcess.stale_after() + timedelta(seconds=1)
    set_cursor(schedule, just_due)
    assert checks(now) == set()


def test_leases_expired_longer_than_a_sweep_need_attention(now, process):
    running_run(now, now - get_settings().SWEEP_INTERVAL - timedelta(seconds=1))
    assert checks(now) == {health.UNSWEPT_LEASES}


def test_leases_expired_within_a_sweep_interval_are_fine(now, process):
    running_run(now, now - get_settings().SWEEP_INTERVAL + timedelta(seconds=1))
    assert checks(now) == set()


def test_schedules_disabled_by_errors_need_attention(now, process):
    disabled_by_error()
    assert checks(now) == {health.DISABLED_BY_ERRORS}


def test_schedules_paused_by_hand_or_failing_but_enabled_are_fine(now, process):
    ScheduleFactory(name="paused", enabled=False)
    failing = ScheduleFactory(name="failing")
    Schedule.objects.filter(pk=failing.pk).update(last_error="one bad tick")
    assert checks(now) == set()


# -- the report ------------------------------------------------------------------------------


def test_the_report_lists_due_running_expired_and_failing(now, process):
    soon = ScheduleFactory(name="soon")
    set_cursor(soon, now + timedelta(minutes=30))
    later = ScheduleFactory(name="later")
    set_cursor(later, now + timedelta(hours=2))
    held = running_run(now, now + timedelta(minutes=1), holder="web-1:42")
    expired = running_run(now, now - timedelta(seconds=1), holder="web-2:7")
    RunFactory(status="failed", error_code="ValueError", finished_at=now - timedelta(hours=1))
    RunFactory(status="failed", error_code="Old", finished_at=now - timedelta(hours=25))
    report = health.gather(now)
    due = {s["name"] for s in report.due_soon}
    assert "soon" in due
    assert "later" not in due
    assert {(r["run_id"], r["holder"]) for r in report.running} == {
        (held.pk, "web-1:42"),
        (expired.pk, "web-2:7"),
    }
    assert [(r["run_id"], r["holder"]) for r in report.expired_leases] == [(expired.pk, "web-2:7")]
    assert report.failures == 1
    assert [r["error_code"] for r in report.latest_failures] == ["ValueError"]
    assert [p["name"] for p in report.schedulers] == ["test:1"]


def test_fire_lag_percentiles_interpolate_between_first_attempts(now):
    for seconds in (1, 2, 3, 4, 5):
        started_run(now, timedelta(seconds=seconds))
    started_run(now, timedelta(hours=2), attempt=2)  # a retry: not the scheduler's lag
    old = RunFactory(status="succeeded", attempt=1, started_at=now - timedelta(hours=2))
    Run.objects.filter(pk=old.pk).update(plan_time=old.started_at - timedelta(minutes=9))
    lag = health.fire_lag(now)
    assert lag.runs == 5
    assert lag.p50 == timedelta(seconds=3)
    assert lag.p99 == timedelta(seconds=4.96)


def test_fire_lag_without_runs_has_no_percentiles(now):
    assert health.fire_lag(now) == health.Lag(0, None, None)


def queries_of_gather(now) -> int:
    with CaptureQueriesContext(connection) as captured:
        health.gather(now)
    return len(captured.captured_queries)


def some_of_everything(now, first: int, n: int) -> None:
    for k in range(first, first + n):
        SchedulerProcessFactory(host=f"h{k}", pid=k, started_at=now)
        overdue_schedule(now, name=f"due{k}")
        disabled_by_error(name=f"broken{k}")
        running_run(now, now - timedelta(minutes=5), holder=f"h{k}:1")
        started_run(now, timedelta(seconds=k))
        RunFactory(status="failed", scope=f"s{k}", finished_at=now)


def test_the_report_costs_the_same_queries_however_many_rows(now):
    some_of_everything(now, 0, 1)
    few = queries_of_gather(now)
    some_of_everything(now, 1, 3)
    assert queries_of_gather(now) == few


# -- periodic_status -------------------------------------------------------------------------


def test_status_json_has_stable_keys_and_iso_times(now, process):
    running_run(now, now + timedelta(minutes=1))
    data = json.loads(status(json=True))
    assert set(data) == {
        "now",
        "ok",
        "problems",
        "schedulers",
        "runs_by_status",
        "due_soon",
        "running",
        "expired_leases",
        "schedule_errors",
        "needing_attention",
        "paused",
        "failures",
        "lag",
    }
    assert data["ok"] is True
    assert set(data["failures"]) == {"window_seconds", "count", "latest", "by_scope", "more_scopes"}
    assert set(data["lag"]) == {"window_seconds", "runs", "p50_seconds", "p99_seconds"}
    assert set(data["running"][0]) == {
        "run_id",
        "job",
        "scope",
        "started_at",
        "holder",
        "expires_at",
    }
    assert data["schedulers"][0]["heartbeat_at"].endswith("Z")


def test_status_json_names_the_failed_checks_and_exits_1(now, process):
    disabled_by_error()
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("periodic_status", json=True, stdout=out)
    assert raised.value.returncode == 1
    data = json.loads(out.getvalue())
    assert data["ok"] is False
    assert [p["check"] for p in data["problems"]] == [health.DISABLED_BY_ERRORS]


def test_status_plain_when_not_a_terminal(now, process):
    running_run(now, now + timedelta(minutes=1), holder="web-1:42")
    text = status()
    assert "Running\n" in text
    assert "held by web-1:42" in text
    assert "1 runs  p50 " in text
    assert "\x1b[" not in text  # no terminal escapes when piped
    assert text.rstrip().endswith("OK")


def test_status_renders_rich_tables_when_forced(now, process):
    running_run(now, now + timedelta(minutes=1), holder="web-1:42")
    text = status(force_color=True)
    assert "web-1:42" in text
    assert "\x1b[" in text
    assert "┃" in text or "│" in text  # drawn as a table


def test_status_no_color_stays_plain_even_with_rich(now, process):
    assert "│" not in status(no_color=True)


def test_status_exits_0_when_all_is_well(now, process):
    assert status().rstrip().endswith("OK")  # no CommandError: exit status 0


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_status_exits_3_when_the_database_cannot_be_reached():
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PERIODIC_TEST_DB": "postgres",
        "PERIODIC_TEST_POSTGRES_URL": f"postgres://postgres@127.0.0.1:{closed_port()}/periodic",
    }
    command = [sys.executable, "-m", "django", "periodic_status"]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 3, finished.stderr
    assert "Cannot query the database" in finished.stderr


# -- the health view -------------------------------------------------------------------------


def test_health_view_is_200_when_nothing_needs_attention(client, process):
    response = client.get("/periodic/health/")
    assert response.status_code == 200
    assert response.json()["ok"] is True
    assert response.json()["problems"] == []
    assert "no-cache" in response["Cache-Control"]


def test_health_view_is_503_naming_the_problems(client, now):
    overdue_schedule(now)
    response = client.get("/periodic/health/")
    assert response.status_code == 503
    assert [p["check"] for p in response.json()["problems"]] == [health.NO_LIVE_SCHEDULER]


def test_health_view_costs_a_constant_number_of_queries(client, now, django_assert_num_queries):
    some_of_everything(now, 0, 3)
    expected = 6 if connection.vendor == "postgresql" else 5  # + the database's clock
    with django_assert_num_queries(expected):
        client.get("/periodic/health/")


# -- django-health-check ---------------------------------------------------------------------


def test_health_check_view_reports_the_periodic_check_ok(client, process):
    response = client.get("/ht/?format=json")
    assert response.status_code == 200
    assert list(response.json().values()) == ["OK"]


def test_health_check_view_fails_with_the_periodic_problem(client, now, process):
    disabled_by_error()
    response = client.get("/ht/?format=json")
    assert response.status_code == 500
    (message,) = response.json().values()
    assert "1 schedule(s) disabled by errors" in message
