"""Sentry Crons from real processes: a ``run_scheduler`` that runs its jobs, and the
hand-off's ``db_worker``, each with sentry-sdk initialised by tests.settings and a transport
that writes the check-ins it would send to a file of its own (PERIODIC_TEST_SENTRY_FILE).

PostgreSQL only: real processes share the test database (see tests.processes).
"""

from collections import defaultdict
from datetime import timedelta

import pytest

from django_periodic.db import clock
from django_periodic.models import Lease, Run
from tests.factories import ScheduleFactory
from tests.processes import wait_for
from tests.sentry_transport import read

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ON = {"SENTRY_CRONS": True, "POLL_INTERVAL": 0.5}


def statuses_by_slug(check_ins: list[dict]) -> dict[str, list[str]]:
    found = defaultdict(list)
    for check_in in check_ins:
        found[check_in["monitor_slug"]].append(check_in["status"])
    return dict(found)


def ended(schedule, status: str) -> Run | None:
    return Run.objects.filter(schedule=schedule, status=status).first()


def test_a_scheduler_process_checks_in_ok_for_a_success_and_error_for_a_timeout(
    postgres, children, tmp_path
):
    check_ins = tmp_path / "scheduler.jsonl"
    start = clock.now() + timedelta(seconds=2)
    hourly = {"interval": timedelta(hours=1), "start_at": start}
    fine = ScheduleFactory(name="fine", job="tests.jobs.add", args=[1, 2], **hourly)
    slow = ScheduleFactory(
        name="slow", job="tests.jobs.linger", kwargs={"seconds": 5}, timeout=timedelta(seconds=1),
        **hourly,
    )  # fmt: skip
    child = children.start(
        settings={**ON, "TIMEOUT_GRACE": 0.5}, env={"PERIODIC_TEST_SENTRY_FILE": str(check_ins)}
    )
    wait_for(lambda: ended(fine, "succeeded"), 60, "the fine run to succeed")
    timed_out = wait_for(lambda: ended(slow, "failed"), 60, "the slow run to time out")
    assert timed_out.error_code == "timeout"
    wait_for(lambda: len(read(check_ins)) >= 4, 30, "four check-ins")
    assert child.terminate() == 0, child.output()
    sent = read(check_ins)
    assert statuses_by_slug(sent) == {
        "fine": ["in_progress", "ok"],
        "slow": ["in_progress", "error"],
    }
    for slug in ("fine", "slow"):
        assert len({c["check_in_id"] for c in sent if c["monitor_slug"] == slug}) == 1
    slow_config = next(c["monitor_config"] for c in sent if c["monitor_slug"] == "slow")
    assert slow_config["max_runtime"] == 1


def test_handed_off_runs_check_in_from_the_worker_that_runs_them(postgres, children, tmp_path):
    planner_file, worker_file = tmp_path / "planner.jsonl", tmp_path / "worker.jsonl"
    settings = {**ON, "TASKS_BACKEND": "database"}
    schedule = ScheduleFactory(
        name="handed-off",
        job="tests.jobs.add",
        args=[1, 2],
        interval=timedelta(hours=1),
        start_at=clock.now() + timedelta(seconds=2),
    )
    planner = children.start(
        "--plan-only", settings=settings, env={"PERIODIC_TEST_SENTRY_FILE": str(planner_file)}
    )
    worker = children.start_worker(
        settings=settings, env={"PERIODIC_TEST_SENTRY_FILE": str(worker_file)}
    )
    run = wait_for(lambda: ended(schedule, "succeeded"), 60, "the handed-off run to succeed")
    assert run.tasks_backend == "database"
    wait_for(lambda: len(read(worker_file)) >= 2, 30, "the worker's two check-ins")
    assert planner.terminate() == 0, planner.output()
    worker.kill()
    started, finished = read(worker_file)
    assert (started["status"], finished["status"]) == ("in_progress", "ok")
    assert started["check_in_id"] == finished["check_in_id"]
    assert started["monitor_slug"] == "handed-off"
    assert read(planner_file) == []  # the planner only enqueued it


def test_a_run_given_back_at_shutdown_closes_its_check_in_as_an_error(postgres, children, tmp_path):
    """A stop past the grace gives the running job's run back, to run again: its attempt's
    ``in_progress`` is closed at once, not left to Sentry's ``max_runtime``."""
    check_ins = tmp_path / "scheduler.jsonl"
    schedule = ScheduleFactory(
        name="slow",
        job="tests.jobs.record",
        kwargs={"seconds": 120},
        interval=timedelta(hours=1),
        start_at=clock.now() + timedelta(seconds=1),
        allow_stale_reentry=True,
    )
    child = children.start(
        "--workers",
        "1",
        settings={**ON, "SHUTDOWN_GRACE": 0.5},
        env={"PERIODIC_TEST_SENTRY_FILE": str(check_ins)},
    )
    wait_for(Lease.objects.filter(started_at__isnull=False).exists, 30, "the job to start")
    assert child.terminate() == 0, child.output()
    assert Run.objects.get(schedule=schedule).status == "pending"
    sent = read(check_ins)
    assert statuses_by_slug(sent) == {"slow": ["in_progress", "error"]}
    assert len({c["check_in_id"] for c in sent}) == 1
