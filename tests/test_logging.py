"""The run log: a structured line per run transition, and run_scheduler's --verbosity."""

import logging

import pytest
from django.core.management import call_command

from django_periodic import signals
from django_periodic.db import clock
from django_periodic.engine.runs import claims, outcomes
from django_periodic.operations import runlog
from django_periodic.testing import run_due
from tests.factories import RunFactory, ScheduleFactory


def run_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_periodic.runs"]


@pytest.mark.django_db(transaction=True)
def test_each_transition_is_one_line_with_the_runs_fields_in_extra(run_log, caplog):
    caplog.set_level(logging.INFO, logger="django_periodic.runs")
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    (run,) = run_due(now=schedule.next_fire_at)
    records = run_records(caplog)
    assert [(r.event, r.status, r.levelname) for r in records] == [
        ("planned", "pending", "INFO"),
        ("started", "running", "INFO"),
        ("finished", "succeeded", "INFO"),
    ]
    finished = records[-1]
    fields = {name: getattr(finished, name) for name in runlog.FIELDS}
    assert fields == {
        "event": "finished",
        "schedule": schedule.name,
        "schedule_id": schedule.pk,
        "run_id": run.pk,
        "scope": "",
        "plan_time": run.plan_time.isoformat(),
        "attempt": 1,
        "status": "succeeded",
        "reason": "",
        "duration": run.duration.total_seconds(),
    }


@pytest.mark.django_db(transaction=True)
def test_a_failure_is_logged_as_a_warning_with_its_error_code(run_log, caplog):
    caplog.set_level(logging.INFO, logger="django_periodic.runs")
    schedule = ScheduleFactory(job="tests.jobs.explode", max_attempts=2)
    run_due(now=schedule.next_fire_at)
    (retried,) = [r for r in run_records(caplog) if r.event == "retried"]
    assert (retried.levelname, retried.status, retried.reason) == (
        "WARNING",
        "retrying",
        "RuntimeError",
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reentry", [True, False])
def test_a_run_given_back_at_shutdown_is_logged_as_a_warning(run_log, caplog, process, reentry):
    """What a stopping scheduler gives back unfinished (engine/loop/shutdown.py): released
    to run again, or failed ``interrupted``; one warning either way."""
    caplog.set_level(logging.INFO, logger="django_periodic.runs")
    schedule = ScheduleFactory(allow_stale_reentry=reentry)
    now = clock.now()
    RunFactory(schedule=schedule, plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    given_back = [outcomes.released(claim)]
    outcomes.announce_released(given_back, outcomes.record(given_back))
    (record,) = [r for r in run_records(caplog) if r.event in ("released", "finished")]
    expected = ("released", "pending", "") if reentry else ("finished", "failed", "interrupted")
    assert (record.event, record.status, record.reason) == expected
    assert record.levelname == "WARNING"


def test_the_run_log_listens_only_while_its_logger_is_enabled_for_info():
    level = runlog.logger.level
    try:
        runlog.logger.setLevel(logging.WARNING)
        assert not runlog.follow()
        assert not signals.listened(*signals.RUN_SIGNALS, signals.schedule_disabled)
        runlog.logger.setLevel(logging.INFO)
        assert runlog.follow()
        assert signals.listened(*signals.RUN_SIGNALS, signals.schedule_disabled)
    finally:
        runlog.logger.setLevel(level)
        runlog.follow()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("verbosity", "package_level", "run_log_level"),
    [
        (0, logging.WARNING, logging.WARNING),
        (1, logging.INFO, logging.WARNING),
        (2, logging.DEBUG, logging.INFO),
        (3, logging.DEBUG, logging.INFO),
    ],
)
def test_run_scheduler_verbosity_sets_the_levels_and_the_run_log(
    verbosity, package_level, run_log_level
):
    package = logging.getLogger("django_periodic")
    saved = package.level, runlog.logger.level
    try:
        call_command("run_scheduler", "--once", "--workers=1", verbosity=verbosity)
        assert (package.level, runlog.logger.level) == (package_level, run_log_level)
        assert signals.listened(signals.run_finished) == (run_log_level == logging.INFO)
    finally:
        package.setLevel(saved[0])
        runlog.logger.setLevel(saved[1])
        runlog.follow()
