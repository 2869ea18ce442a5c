"""Concurrency limits with real ``run_scheduler`` processes, SIGKILLed and restarted: the
jobs' own notes of when they started and ended never show more of them at once than the
limit allows, and every fire is accounted for.

The oracle is outside the ledger: the notes each job writes as it starts and ends
(tests.jobs.occupy); a job whose process was killed ended at the kill."""

import itertools
import time
from collections import Counter, defaultdict
from datetime import timedelta

import pytest

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.models import ConcurrencyLimit, Run, Schedule, SchedulerProcess
from tests import crash, processes
from tests.limits_oracle import jobs_of, most_at_once
from tests.test_crash import seed  # noqa: F401 (a fixture)
from tests.test_handoff_workers import SETTINGS as HANDOFF_SETTINGS

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
    yield from crash.reaped(
        crash.Fleet(3, ["--workers", "4"], crash.CHILD_SETTINGS, tmp_path, seed)
    )


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
    assert len(succeeded) >= 10
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


# -- handed off to task workers --------------------------------------------------------------

# The schedulers hand every run to the "database" tasks backend; its db_worker processes run
# them. A task its worker took and was killed with before claiming the run is enqueued again
# after a pickup timeout this short.
WORKER_SETTINGS = {**HANDOFF_SETTINGS, "TASKS_PICKUP_TIMEOUT": 2}
# No scheduler is killed here: a fire is never missed, only skipped behind its schedule's
# pending run, for want of a slot, or picked up past its start deadline.
HANDOFF_SKIP_CODES = SKIP_CODES - {ErrorCode.MISSED}
KILLS = 4


@pytest.fixture
def workers(postgres, transactional_db, tmp_path, seed):  # noqa: F811
    """Three db_worker children, run by run; all are reaped after the test."""
    command = processes.TaskWorkerProcess.COMMAND
    yield from crash.reaped(crash.Fleet(3, [], WORKER_SETTINGS, tmp_path, seed, command=command))


def kill_workers_in_jobs(workers: crash.Fleet, notes, kills: int) -> None:
    """SIGKILL ``kills`` times a live worker whose job has noted its start and not its end,
    each restarted at once; the next kill once the replacement has started a job."""
    replacement = None

    def busy() -> crash.LoggedChild | None:
        jobs = jobs_of(notes) if notes.exists() else []
        if replacement and replacement.pid not in {job.pid for job in jobs}:
            return None  # the last one restarted runs no job yet
        running = {job.pid for job in jobs if job.end is None}
        return next((child for child in workers.live if child.pid in running), None)

    for n in range(kills):
        victim = processes.wait_for(busy, 30, f"a worker in a job (kill {n + 1})", poll=0.02)
        workers.kill_one(victim)
        replacement = workers.live[-1]


def test_a_limit_of_two_holds_for_runs_handed_to_task_workers_killed_mid_job(
    children, workers, tmp_path
):
    """Six one-second schedules share a limit of two; two ``--plan-only`` schedulers hand
    their runs to three db_worker processes, one at a time of which is SIGKILLed in the
    middle of a job and restarted. By the jobs' own notes (tests.jobs.occupy), a killed job
    ending at its kill: never more than two jobs at once, and two at times; every job ran on
    a worker. Every fire is a run row, and each that did not run says why."""
    notes = tmp_path / "notes"
    schedulers = [children.start("--plan-only", settings=WORKER_SETTINGS) for _ in range(2)]
    workers.start()
    # The first fire once the schedulers are up: one planned past its grace would be missed.
    pids = {scheduler.pid for scheduler in schedulers}
    registered = SchedulerProcess.objects.filter(pid__in=pids)
    processes.wait_for(lambda: registered.count() == 2, 60, "the schedulers to start", poll=0.2)
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    limit = ConcurrencyLimit.objects.create(name="two", max_running=2)
    limited_schedules(
        limit, 6, notes, 0.6, start_at=start, lease_timeout=timedelta(seconds=3)
    )  # fmt: skip
    kill_workers_in_jobs(workers, notes, KILLS)
    after_kills = time.time()
    processes.wait_for(
        lambda: sum(job.start > after_kills for job in jobs_of(notes)) >= 10,
        30, "10 jobs started after the kills", poll=0.2,
    )  # fmt: skip
    Schedule.objects.update(enabled=False)
    stopped_at = clock.now()
    runs = Run.objects.filter(schedule__concurrency_limit=limit)
    processes.wait_for(lambda: not runs.active().exists(), 30, "the last runs to end", poll=0.2)
    for scheduler in schedulers:
        assert scheduler.terminate() == 0, scheduler.output()
    workers.reap()  # nothing of ours left to run (see test_handoff_workers)

    killed = {event.pid: event.at.timestamp() for event in workers.timeline if event.what == "kill"}
    jobs = jobs_of(notes, killed)
    at_once = most_at_once(jobs)
    assert at_once == 2, f"{at_once} jobs at once\n{workers.logs()}"
    assert {job.pid for job in jobs} <= {child.pid for child in workers.started}
    cut_off = [job for job in jobs if job.pid in killed and job.end == killed[job.pid]]
    assert cut_off, "no job was killed in the middle"
    succeeded = set(runs.filter(status=Run.Status.SUCCEEDED).values_list("pk", flat=True))
    assert succeeded <= {job.run for job in jobs}
    assert {job.run for job in jobs if job.pid not in killed} <= succeeded, workers.logs()
    assert len(succeeded) >= 10
    assert set(runs.values_list("tasks_backend", flat=True)) == {"database"}
    # Every fire from the first until planning stopped is a row, once; each that did not
    # run says why.
    skipped = runs.filter(status=Run.Status.SKIPPED)
    assert set(skipped.values_list("error_code", flat=True)) <= HANDOFF_SKIP_CODES, list(
        skipped.values_list("schedule__name", "plan_time", "created_at", "error_code")
    )
    failed = set(runs.filter(status=Run.Status.FAILED).values_list("error_code", flat=True))
    assert failed <= {ErrorCode.LEASE_EXPIRED}
    by_schedule = plan_times_by_schedule(runs)
    assert len(by_schedule) == 6
    for name, plan_times in by_schedule.items():
        expected = [start + k * timedelta(seconds=1) for k in range(len(plan_times))]
        assert plan_times == expected, f"{name} lost or doubled a fire"
        assert plan_times[-1] >= stopped_at - timedelta(seconds=5), f"{name} stopped early"
    codes = Counter(skipped.values_list("error_code", flat=True))
    print(f"{len(killed)} workers killed, {len(cut_off)} in a job; {runs.count()} runs, ", end="")
    print(f"{len(succeeded)} succeeded; skipped {dict(codes)}")
