"""Real ``run_scheduler`` processes for tests, and waiting on database states."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.db import connection

from django_periodic.db import clock
from django_periodic.models import Schedule
from tests.factories import ScheduleFactory
from tests.models import Execution

ROOT = Path(__file__).resolve().parent.parent
# The application_name of child processes' PostgreSQL sessions (see tests.settings).
CHILD_APPLICATION_NAME = "periodic-test-child"


class SchedulerProcess:
    """A ``manage.py run_scheduler`` child process using the test database."""

    # What follows ``python -m``: a module, then its arguments.
    COMMAND: tuple[str, ...] = ("django", "run_scheduler")

    def __init__(self, *args: str, settings: dict | None = None, env: dict | None = None) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PERIODIC_TEST_DB_NAME": connection.settings_dict["NAME"],
            "PERIODIC_TEST_SETTINGS": json.dumps(settings or {}),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        command = [sys.executable, "-m", *self.COMMAND, *args]
        self.popen = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # Read as it comes, so tests can wait for a line and a full pipe never blocks the child.
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self._lines.append(line)

    def wait_for_line(self, text: str, timeout: float = 30) -> str:
        """Wait until the child prints a line containing ``text``; return that line."""

        def printed() -> str | None:
            return next((line for line in list(self._lines) if text in line), None)

        return wait_for(printed, timeout, f"the child to print {text!r}")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit code."""
        self.popen.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> int:
        self.popen.wait(timeout)
        return self.popen.returncode

    def output(self) -> str:
        """Everything the child printed, once it has exited ("" before)."""
        if self.popen.poll() is None:
            return ""
        self._reader.join(timeout=10)
        return "".join(self._lines)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


class TaskWorkerProcess(SchedulerProcess):
    """A django-tasks-db ``db_worker`` child executing the tasks of the "database" backend
    (tests.settings.TASKS): the worker fleet runs are handed to."""

    COMMAND = (
        *("django", "db_worker"),
        *("--backend", "database", "--queue-name", "default", "--interval", "0.05"),
        "--no-startup-delay",
    )


class CeleryWorkerProcess(SchedulerProcess):
    """A ``celery worker`` child executing the tasks of the "celery" backend
    (tests.settings.TASKS, django-tasks-fennel's Celery app), one at a time."""

    COMMAND = (
        *("celery", "-A", "django_tasks_fennel.app", "worker", "--pool", "solo"),
        *("--queues", "default", "--loglevel", "WARNING"),
        *("--without-heartbeat", "--without-gossip", "--without-mingle"),
    )


# The worker fleets runs are handed to, by tasks backend (tests.settings.TASKS): each runs
# one task at a time.
TASK_WORKERS = {"database": TaskWorkerProcess, "celery": CeleryWorkerProcess}


@dataclass(frozen=True)
class SelfPausing:
    """What ``run_until_it_pauses_itself`` saw: the stopped child, its two schedules, and
    how many times the failing one's job had run when its pause was seen."""

    child: SchedulerProcess
    failing: Schedule
    ticking: Schedule
    ran_when_paused: int


def run_until_it_pauses_itself(
    start_child, *, workers: int, ticks: int, settings: dict
) -> SelfPausing:
    """Beside a schedule that fails every second ("failing", ``pause_after_failures=3``,
    from two seconds on) and its twin that succeeds ("ticking"), start a scheduler child
    (``start_child``: the ``children`` fixture's ``start``) with ``workers`` and
    ``settings``; wait until "failing" pauses itself, then for ``ticks`` more executions
    of "ticking" (the scheduler went on), and stop the child, which must exit cleanly."""
    second = timedelta(seconds=1)
    start = clock.now().replace(microsecond=0) + 2 * second
    failing = ScheduleFactory(
        name="failing",
        job="tests.jobs.record_and_fail",
        interval=second,
        start_at=start,
        pause_after_failures=3,
    )
    ticking = ScheduleFactory(name="ticking", job="tests.jobs.record", interval=second)
    child = start_child("--workers", str(workers), settings=settings)
    paused = Schedule.objects.filter(pk=failing.pk, paused_by="scheduler")
    wait_for(paused.exists, 30, "the failing schedule to pause itself")
    ran = Execution.objects.filter(schedule="failing").count()
    ticked = Execution.objects.filter(schedule="ticking")
    target = ticked.count() + ticks
    wait_for(lambda: ticked.count() >= target, 30, f"{ticks} more fires of the ticking schedule")
    assert child.terminate() == 0
    return SelfPausing(child, failing, ticking, ran)


def wait_for(predicate, timeout: float, message: str = "condition", poll: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout} s waiting for {message}.")
        time.sleep(poll)


def wait_for_children_to_disconnect(timeout: float = 10) -> None:
    """PostgreSQL ends a backend a moment after its client exits; wait, so teardown can drop.

    Only the children's sessions count (tests.settings names them): a thread of this process
    may keep its own connection open (CONN_MAX_AGE), such as asgiref's for async jobs.
    """
    if connection.vendor != "postgresql":
        return

    def alone() -> bool:
        with connection.cursor() as cursor:
            # In a transaction, pg_stat_activity is read once unless its snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [CHILD_APPLICATION_NAME],
            )
            return cursor.fetchone()[0] == 0

    wait_for(alone, timeout, "child processes' database sessions to end")
