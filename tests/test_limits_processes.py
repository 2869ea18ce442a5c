"""Concurrency limits with real ``run_scheduler`` processes, SIGKILLed and restarted: the
jobs' own notes of when they started and ended never show more of them at once than the
limit allows, and every fire is accounted for.

The oracle is outside the ledger: the notes each job writes as it starts and ends
(tests.jobs.occupy); a job whose process was killed ended at the kill."""

import itertools
import time
from collections import defaultdict
from datetime import timedelta

import pytest

from django_periodic.choices import ErrorCode
from django_periodic.models import ConcurrencyLimit, Run, Schedule
from tests import crash, processes
from tests.limits_oracle import jobs_of, most_at_once
from tests.test_crash import seed  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.crash, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# The codes a fire may be skipped with here: behind its schedule's pending run, still
# waiting for a slot at its start deadline, admitted but not claimed by then (its process
# killed), or missed while every process was down.
SKIP_CODES = {
    ErrorCode.OVERLAP,
    ErrorCode.CONCURRENCY_LIMIT,
    ErrorCode.START_DEADLINE,
    ErrorCode.MISSED,
}


@pytest.fixture
def fleet(postgres, transactional_db, tmp_path, seed):  # noqa: F811
    """Three run_scheduler children with fast settings; all are reaped after the test."""
    fleet = crash.Fleet(3, ["--workers", "4"], crash.CHILD_SETTINGS, tmp_path, seed)
    yield fleet
    fleet.reap()
    processes.wait_for_children_to_disconnect()


def limited_schedules(
    limit: ConcurrencyLimit, count: int, notes, seconds: float = 0.3, **fields
) -> None:
    for n in range(count):
        Schedule(
            name=f"s{n:02}", job="tests.jobs.occupy", interval=timedelta(seconds=1),
            kwargs={"notes": str(notes), "seconds": seconds}, concurrency_limit=limit,
            misfire_grace=timedelta(seconds=3), **fields,
        ).save()  # fmt: skip


def run_churned(fleet: crash.Fleet, seconds: float) -> dict[int, float]:
    """Start the fleet, SIGKILL and restart one every 2-4 s for ``seconds``, stop it; the
    kills, pid -> epoch seconds."""
    fleet.start()
    fleet.churn(time.monotonic() + seconds)
    fleet.stop()
    return {event.pid: event.at.timestamp() for event in fleet.timeline if event.what == "kill"}


def test_a_limit_of_two_holds_across_three_processes_killed_and_restarted(fleet, tmp_path):
    notes = tmp_path / "notes"
    limit = ConcurrencyLimit.objects.create(name="two", max_running=2)
    limited_schedules(limit, 20, notes)
    killed = run_churned(fleet, 20)
    jobs = jobs_of(notes, killed)
    assert most_at_once(jobs) == 2, fleet.logs()
    runs = Run.objects.filter(schedule__concurrency_limit=limit)
    # Every job that ended was a run that succeeded, bar those whose process was killed
    # before their outcome was written.
    ended = {job.run for job in jobs if job.pid not in killed}
    succeeded = set(runs.filter(status=Run.Status.SUCCEEDED).values_list("pk", flat=True))
    assert succeeded <= {job.run for job in jobs}
    assert ended - succeeded == set(), fleet.logs()
    assert len(succeeded) >= 20
    # Every fire is a row, and every one that did not run says why.
    skipped = set(runs.filter(status=Run.Status.SKIPPED).values_list("error_code", flat=True))
    assert skipped <= SKIP_CODES
    failed = set(runs.filter(status=Run.Status.FAILED).values_list("error_code", flat=True))
    assert failed <= {ErrorCode.LEASE_EXPIRED}
    for name, plan_times in plan_times_by_schedule(runs).items():
        steps = {later - earlier for earlier, later in itertools.pairwise(plan_times)}
        assert steps <= {timedelta(seconds=1)}, f"{name} lost a fire"


def plan_times_by_schedule(runs) -> dict[str, list]:
    times = defaultdict(list)
    for name, plan_time in runs.order_by("plan_time").values_list("schedule__name", "plan_time"):
        times[name].append(plan_time)
    return times


def test_a_per_scope_limit_of_one_runs_each_scope_alone_and_every_scope(fleet, tmp_path):
    notes = tmp_path / "notes"
    limit = ConcurrencyLimit.objects.create(name="tenant", max_running=1, per_scope=True)
    limited_schedules(limit, 2, notes, 0.1, scopes="tests.fifty", overlap="concurrent")
    killed = run_churned(fleet, 15)
    jobs = jobs_of(notes, killed)
    by_scope = defaultdict(list)
    for job in jobs:
        by_scope[job.scope].append(job)
    assert {scope: most_at_once(js) for scope, js in by_scope.items()} == dict.fromkeys(by_scope, 1)
    assert len(by_scope) == 50, sorted(by_scope)  # every scope progressed
    assert most_at_once(jobs) > 1  # the scopes' slots are their own
