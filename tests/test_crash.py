"""The crash suite: real run_scheduler processes killed with SIGKILL, and PostgreSQL restarted
under them, must keep the promises of docs/semantics.md ("Planning: exactly once per plan
time", "Failures of the process itself", "Failure cases").

Each test fires schedules every second for a while, breaks things, stops the schedulers
gracefully, lets one ``run_scheduler --once`` sweep what the dead left, then reads the
ledger and checks it against what the jobs themselves noted. Whether a job was called is
never read from the ledger: each call appends a line to a file before it does anything
else (``tests.jobs.note``), and writes its Execution row last. The checks:

- one run row per (schedule, plan time);
- no missing plan time while a scheduler was alive: every second from the first fire to the
  schedule's cursor is a run, the cursor reached the graceful stop, none skipped as missed;
- no run left ``running`` (nor any lease held) once its lease expired and a sweep ran;
- every call noted was of an attempt the ledger claimed and marked started, by its holder,
  once, and its run's end accounts for it (succeeded, failed as its job raised, failed
  because its process died, or run again where the schedule allows); an attempt the ledger
  says never started was never called; a run that succeeded was called and left one row;
- ``allow_stale_reentry=False``: no plan time's job was called twice, and a run whose process
  died while its job ran ended ``failed`` with ``lease_expired``;
- a fire is skipped only for overlap, behind its schedule's previous run, still active when
  the fire was planned;
- ``allow_stale_reentry=True``: every plan time not skipped succeeded and its job body ran.
  (With PostgreSQL restarted, a job body that queried while the server was down raised: its
  run fails with that error like any job's; the test bounds those to the jobs in flight.)
- a run failed for a dead process though its job was never called (marked started a moment
  before a call that a kill cut off) only by a killed process, a threads' worth a kill at most.

PostgreSQL only; the restart test also needs PG_DIR and PG_BINDIR (scripts/lib/postgres.sh).
PERIODIC_CRASH_SEED replays a run's kill sequence (the seed is printed; -rP shows the counts).
"""

import os
import random
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from tests import crash, processes

pytestmark = [pytest.mark.crash, pytest.mark.processes]

WORKER_THREADS = 12
WORKERS = ["--workers", str(WORKER_THREADS)]
# The default fleet's worker threads per process.
DEFAULT_FLEET_THREADS = 8
JOB_SECONDS = 0.3  # long enough that kills land mid-run
PLANNING_SLACK = timedelta(seconds=5)  # how far a cursor may trail the graceful stop


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("PERIODIC_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash seed: {value} (replay with PERIODIC_CRASH_SEED={value})")
    return value


@pytest.fixture
def fleet(postgres, transactional_db, tmp_path, seed):
    """Three run_scheduler children with fast settings; all are reaped after the test."""
    fleet = crash.Fleet(3, WORKERS, crash.CHILD_SETTINGS, tmp_path, seed)
    yield fleet
    fleet.reap()
    processes.wait_for_children_to_disconnect()


def sleep_until(deadline: float) -> None:
    time.sleep(max(deadline - time.monotonic(), 0))


def monotonic_at(at: datetime) -> float:
    """The ``time.monotonic()`` reading when the database clock shows ``at``."""
    return time.monotonic() + (at - clock.now()).total_seconds()


def sleep_until_database_clock(at: datetime) -> None:
    """Sleep until the database clock shows ``at``. Over a minute it drifts a millisecond
    or so from ``time.monotonic()``, so a deadline from ``monotonic_at`` may end just short."""
    while (left := (at - clock.now()).total_seconds()) > 0:
        time.sleep(left)


def stop_and_recover(fleet: crash.Fleet) -> datetime:
    """Stop every scheduler gracefully, stop planning, then let one ``--once`` process sweep
    the leases the killed left; return when the graceful stop began."""
    # A child's SIGTERM handler exists once it has registered; a replacement started just
    # before might not have got that far.
    crash.wait_until_registered(fleet)
    codes = fleet.stop()
    assert set(codes.values()) == {0}, f"graceful stop exit codes {codes}\n{fleet.logs()}"
    stopped_at = fleet.first("stop").at
    Schedule.objects.update(enabled=False)
    # A stopped process released what it held; only the killed hold leases now.
    held = {crash.holder_pid(h) for h in Lease.objects.held().values_list("holder", flat=True)}
    assert held <= fleet.pid_set("kill"), f"leases held by stopped processes: {held}"
    # A stopped process unregisters; only the killed ones are left behind.
    assert set(SchedulerProcess.objects.values_list("pid", flat=True)) <= fleet.pid_set("kill")
    crash.wait_for_leases_to_expire()
    once = fleet.start_one("--once", what="recover")
    assert once.wait(120) == 0, fleet.logs([once], lines=50)
    return stopped_at


@pytest.fixture
def notes(tmp_path) -> Path:
    """The file the jobs note their calls in (``tests.jobs.note``)."""
    return tmp_path / "notes.log"


def check_promises(
    ledger: crash.Ledger,
    stopped_at: datetime,
    dead: dict[int, datetime],
    threads: int,
    outages: list[tuple[datetime, datetime]] = (),
    job_failures: frozenset[str] = frozenset(),
) -> None:
    """The promises of every kill and restart (module docstring): ``dead`` {pid: killed at},
    ``threads`` the worker threads of a process, ``outages`` [(down, up)] of the database."""
    crash.fail_if(ledger.duplicate_run_violations(), "one run row per (schedule, plan time)")
    crash.fail_if(
        ledger.missing_plan_time_violations(stopped_at, PLANNING_SLACK),
        "no missing plan time while a scheduler was alive",
    )
    crash.fail_if(ledger.unsettled_violations(), "nothing running once leases expired and swept")
    crash.fail_if(ledger.orphan_execution_violations(), "executions belong to claimed runs")
    crash.fail_if(
        ledger.call_violations(job_failures),
        "every call the jobs noted was claimed, marked started, and is accounted for",
    )
    crash.fail_if(ledger.success_violations(), "a success was called and left one row")
    crash.fail_if(ledger.at_most_once_violations(), "allow_stale_reentry=False: at most once")
    crash.fail_if(ledger.skip_violations(), "a fire is skipped only behind an active run")
    crash.fail_if(
        ledger.lease_violations(dead, outages, job_failures),
        "a run fails, and a lease expires, only because a process died or the database left",
    )
    crash.fail_if(
        ledger.at_least_once_violations(job_failures),
        "allow_stale_reentry=True: every plan time's job completed at least once",
    )
    uncalled = ledger.failed_uncalled()
    crash.fail_if(
        [f"{pid}: {runs}" for pid, runs in uncalled.items() if pid not in dead],
        "a run fails for its process though never called only if that process was killed",
    )
    crash.fail_if(
        [f"{pid}: {len(runs)} {runs}" for pid, runs in uncalled.items() if len(runs) > threads],
        f"at most a threads' worth ({threads}) failed uncalled by a kill",
    )


@pytest.mark.pgbouncer
def test_sigkilled_schedulers_lose_nothing_and_run_nothing_twice(fleet, notes):
    """3 schedulers, 200 schedules every second for 60 s, one SIGKILL every 2-4 s."""
    began = time.monotonic()
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    crash.create_schedules(200, start, seconds=JOB_SECONDS, notes=notes)
    fleet.start()
    crash.wait_until_registered(fleet)
    fleet.churn(until=monotonic_at(start + timedelta(seconds=60)))
    assert len(fleet.pid_set("kill")) >= 12, "the driver killed too few processes"
    sleep_until_database_clock(start + timedelta(seconds=60))
    stopped_at = stop_and_recover(fleet)

    ledger = crash.Ledger.load(notes)
    seconds = round(time.monotonic() - began)
    print(crash.report("SIGKILL", fleet, ledger.counts(), start, seconds=seconds))
    assert stopped_at - start >= timedelta(seconds=60)
    check_promises(ledger, stopped_at, dead=fleet.times("kill"), threads=WORKER_THREADS)


@pytest.fixture
def default_fleet(postgres, transactional_db, tmp_path, seed):
    """Three run_scheduler children with the default heartbeat and sweep intervals."""
    workers = ["--workers", str(DEFAULT_FLEET_THREADS)]
    fleet = crash.Fleet(3, workers, crash.DEFAULT_CHILD_SETTINGS, tmp_path, seed)
    yield fleet
    fleet.reap()
    processes.wait_for_children_to_disconnect()


def test_a_killed_schedulers_runs_are_recovered_at_once_and_not_failed_unstarted(
    default_fleet, notes
):
    """Issue workload: 3 schedulers, 100 at-most-once schedules every second (leases of
    6 s), SIGKILL and restart every 2-5 s for 45 s. A run whose job had not started runs
    again; the dead process's runs are recovered when its session lock goes, not when its
    leases expire; so nearly every fire not skipped behind its active run succeeds.

    A run is marked started a moment before its job is called, and with jobs of 50 ms or
    more none is marked ahead of the threads (docs/semantics.md, "Start"): so a kill can
    leave failed, never called, only the runs its threads had just taken, a threads' worth
    at most, and it rarely lands in that moment. How often depends on the machine's load
    (0-5 runs over 13 kills, loaded), so the bound on the whole is a quarter of a threads'
    worth a kill: runs marked when they are claimed ahead of their plan time leave about a
    threads' worth a kill.

    The job notes each call in a file before anything else: a failed run with no note is
    one whose job was never called (the oracle is the job's own record, not the ledger's
    start marks)."""
    fleet = default_fleet
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    lease_timeout = timedelta(seconds=6)
    crash.create_schedules(100, start, seconds=0.05, notes=notes, lease_timeout=lease_timeout)
    Schedule.objects.update(allow_stale_reentry=False)
    fleet.start()
    crash.wait_until_registered(fleet)
    fleet.churn(until=monotonic_at(start + timedelta(seconds=45)), every=(2.0, 5.0))
    stopped_at = stop_and_recover(fleet)

    ledger = crash.Ledger.load(notes)
    dead = fleet.times("kill")
    recovery = ledger.recovery_seconds(dead)
    median = recovery[len(recovery) // 2] if recovery else 0.0
    never_called = ledger.failed_uncalled()
    print(
        crash.report(
            "SIGKILL, default intervals",
            fleet,
            ledger.counts(),
            start,
            succeeded=f"{ledger.succeeded_share():.1%}",
            recovery_s=f"median {median:.2f}, max {max(recovery, default=0):.2f}, all {recovery}",
            failed_never_called={pid: len(runs) for pid, runs in never_called.items()},
        )
    )
    check_promises(ledger, stopped_at, dead=dead, threads=DEFAULT_FLEET_THREADS)
    assert ledger.succeeded_share() >= 0.95, ledger.counts()
    in_all = sum(len(runs) for runs in never_called.values())
    assert in_all <= len(dead) * DEFAULT_FLEET_THREADS // 4, never_called
    # Recovered by the lost session lock, not by expiry (which takes the whole lease).
    assert recovery and median < lease_timeout.total_seconds() / 2, recovery


def test_killed_schedulers_leave_each_atomic_plan_time_exactly_one_row(default_fleet, notes):
    """The same workload with an atomic job (docs/semantics.md, "Atomic jobs"): a killed
    attempt's writes go with it and its run is run again, so every plan time succeeds with
    exactly one row, its last attempt's, and none fails for a kill. Every call the job noted
    ended its run or was followed by another attempt.

    The schedules run concurrently with themselves: no fire waits on the one before it (a
    killed run held until it is swept, or a slow one on a loaded machine, which the skip
    policy would skip it for), so every fire must run."""
    fleet = default_fleet
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    crash.create_schedules(
        100,
        start,
        seconds=0.05,
        notes=notes,
        job="tests.jobs.atomic_record",
        lease_timeout=timedelta(seconds=6),
        overlap=Schedule.Overlap.CONCURRENT,
    )
    Schedule.objects.update(allow_stale_reentry=False)
    fleet.start()
    crash.wait_until_registered(fleet)
    fleet.churn(until=monotonic_at(start + timedelta(seconds=45)), every=(2.0, 5.0))
    stopped_at = stop_and_recover(fleet)

    ledger = crash.Ledger.load(notes)
    print(
        crash.report(
            "SIGKILL, atomic job",
            fleet,
            ledger.counts(),
            start,
            succeeded=f"{ledger.succeeded_share():.1%}",
        )
    )
    crash.fail_if(ledger.duplicate_run_violations(), "one run row per (schedule, plan time)")
    crash.fail_if(
        ledger.missing_plan_time_violations(stopped_at, PLANNING_SLACK),
        "no missing plan time while a scheduler was alive",
    )
    crash.fail_if(ledger.unsettled_violations(), "nothing running once leases expired and swept")
    crash.fail_if(ledger.exactly_once_effect_violations(), "atomic: exactly one row per success")
    crash.fail_if(ledger.call_violations(), "atomic: every call ended its run or ran again")
    crash.fail_if(ledger.success_violations(), "atomic: a success was called")
    unrun = [run for run in ledger.runs if run.status != "succeeded"]
    crash.fail_if([f"run {r.pk}: {r.status} {r.error_code}" for r in unrun], "atomic: all ran")


# When PostgreSQL is restarted, in seconds after the first fire (the fires go on for 30 s,
# so several seconds of them follow each restart's RECOVERY).
RESTARTS = (8, 18)
# A job called this long before the server went away may still be writing its row when it
# does: its length, and as much again for a loaded machine's late wake-up from its sleep.
# (Measured: the jobs that failed were called from 0.3 s before it until 0.06 s after.)
IN_FLIGHT = timedelta(seconds=2 * JOB_SECONDS)
# A job called once the server answers again gets a fresh connection (a worker's
# connections are checked before each run): none of them may fail for the restart.
IN_FLIGHT_AFTER = timedelta(seconds=0.1)
# From this long after the server answers again, the schedulers have carried on: their
# loops' retries (1 s, then 2 s after the first error) found it, and their threads worked
# off the fires that piled up meanwhile (measured: about 2 s of fires mostly skipped for
# overlap after a restart of half a second, then back to 80-100 % succeeded a second).
RECOVERY = timedelta(seconds=5)
# From then on, at every plan time at least this share of the runs succeeds. The others
# are skipped for overlap behind a run the busy threads started late (36 threads for 100
# jobs of 0.3 s a second: 0-25 % a second on 2 cores). A scheduler that fails or stalls
# every run for a while after a restart has plan times with none.
RECOVERED_SHARE = 0.5


def pg_ctl_restart() -> None:
    """Restart the test PostgreSQL server in place (same data directory and port)."""
    pg_dir, bindir = os.environ.get("PG_DIR"), os.environ.get("PG_BINDIR")
    command = [
        f"{bindir}/pg_ctl",
        *("-D", f"{pg_dir}/data", "-l", f"{pg_dir}/server.log"),
        *("-m", "fast", "-w", "-t", "60", "restart"),
    ]
    if os.geteuid() == 0:  # PostgreSQL runs as its own user (scripts/lib/postgres.sh)
        command = ["runuser", "-u", "postgres", "--", *command]
    connection.close()  # ours dies too: reconnect at the next query
    # -l: the server must not inherit our output, or this call would wait for it to exit.
    subprocess.run(command, cwd="/", stdout=subprocess.DEVNULL, check=True, timeout=90)


def test_schedulers_carry_on_after_postgres_restarts(fleet, notes):
    """3 schedulers, 100 schedules every second for 30 s; PostgreSQL restarted twice.

    A job whose Execution row is written while the server is away raises, and its run fails
    with that error like any job's: so may the runs whose jobs were in flight at a restart,
    and those only (by the jobs' notes: called from IN_FLIGHT before the server went away
    until it answered again). A lease may expire only if the outage kept it from being
    extended. And the schedulers carry on: from RECOVERY after the server answered again
    until the next restart, most runs of every plan time succeed (RECOVERED_SHARE)."""
    if not (os.environ.get("PG_DIR") and os.environ.get("PG_BINDIR")):
        pytest.skip("needs PG_DIR and PG_BINDIR of a server we may restart (scripts/test.sh)")
    began = time.monotonic()
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    crash.create_schedules(100, start, seconds=JOB_SECONDS, notes=notes)
    fleet.start()
    crash.wait_until_registered(fleet)
    for second in RESTARTS:
        sleep_until(monotonic_at(start + timedelta(seconds=second)))
        down = fleet.event("pg_down")
        pg_ctl_restart()
        up = fleet.event("pg_up")
        print(f"PostgreSQL restarted: down at {down.at:%H:%M:%S.%f}, up at {up.at:%H:%M:%S.%f}")
    sleep_until(monotonic_at(start + timedelta(seconds=30)))
    assert all(child.popen.poll() is None for child in fleet.live), fleet.logs()
    stopped_at = stop_and_recover(fleet)

    ledger = crash.Ledger.load(notes)
    outages = fleet.outages()
    seconds = round(time.monotonic() - began)
    print(crash.report("PG restart", fleet, ledger.counts(), start, seconds=seconds))
    check_promises(
        ledger,
        stopped_at,
        dead={},
        threads=WORKER_THREADS,
        outages=outages,
        job_failures=crash.DATABASE_ERRORS,
    )
    in_flight = [(down - IN_FLIGHT, up + IN_FLIGHT_AFTER) for down, up in outages]
    crash.fail_if(
        ledger.failed_outside(in_flight), "a run fails only if its job was in flight at a restart"
    )
    downs = [down for down, _ in outages[1:]] + [stopped_at]
    recovered = [
        (up + RECOVERY, next_down - IN_FLIGHT)
        for (_, up), next_down in zip(outages, downs, strict=True)
    ]
    crash.fail_if(
        ledger.thin_plan_time_violations(recovered, RECOVERED_SHARE),
        f"from {RECOVERY.total_seconds():.0f} s after a restart, at every plan time at least "
        f"{RECOVERED_SHARE:.0%} of the runs succeed",
    )


# A worker killed after it took a task from the queue but before it claimed the run loses
# the task: the schedulers enqueue it again after the pickup timeout (5 min by default).
HANDOFF_SETTINGS = {**crash.CHILD_SETTINGS, "TASKS_PICKUP_TIMEOUT": 5}


@pytest.fixture
def handoff_fleet(postgres, transactional_db, tmp_path, seed):
    """Three run_scheduler children that enqueue lost tasks again after 5 s."""
    fleet = crash.Fleet(3, WORKERS, HANDOFF_SETTINGS, tmp_path, seed)
    yield fleet
    fleet.reap()
    processes.wait_for_children_to_disconnect()


@pytest.fixture
def task_workers(worker_backend, transactional_db, tmp_path, seed):
    """Three task worker children of that backend; all are reaped after the test."""
    command = processes.TASK_WORKERS[worker_backend].COMMAND
    fleet = crash.Fleet(3, [], crash.CHILD_SETTINGS, tmp_path, seed, command=command)
    yield fleet
    fleet.reap()


def test_sigkilled_task_workers_lose_nothing_and_run_nothing_twice(
    handoff_fleet, task_workers, worker_backend, notes
):
    """Runs handed to django-tasks-db or to Celery: 3 schedulers plan and enqueue, 3 workers
    execute, one SIGKILLed every 2-4 s; 20 schedules every second for 40 s (a worker runs one
    task at a time: 3 of them keep up with 20 jobs of 0.1 s a second, busy two thirds of it)."""
    began = time.monotonic()
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    crash.create_schedules(20, start, seconds=0.1, notes=notes, tasks_backend=worker_backend)
    handoff_fleet.start()
    task_workers.start()
    crash.wait_until_registered(handoff_fleet)
    task_workers.churn(until=monotonic_at(start + timedelta(seconds=40)))
    assert len(task_workers.pid_set("kill")) >= 8, "the driver killed too few workers"
    # Planning stops here; the schedulers settle what the killed workers left (their
    # leases expire and are swept, reentered runs are enqueued again, tasks lost in a
    # killed Celery worker are enqueued again) before they stop.
    Schedule.objects.update(enabled=False)
    stopped_at = clock.now()
    try:
        processes.wait_for(
            lambda: not Run.objects.active().exists(), 90, "the handed-off runs to settle", poll=0.2
        )
    except AssertionError as exc:
        active = Run.objects.active().values_list("pk", "status", "attempt", "enqueued_at")
        raise AssertionError(f"{exc}\nstill active: {list(active)[:10]}") from None
    # Every run has settled. How a worker exits on SIGTERM is its own business (db_worker
    # exits 1 inside its own COMMIT), not a promise of ours: the workers are killed.
    task_workers.reap()
    codes = handoff_fleet.stop()
    assert set(codes.values()) == {0}, f"graceful stop exit codes {codes}\n{handoff_fleet.logs()}"

    ledger = crash.Ledger.load(notes)
    seconds = round(time.monotonic() - began)
    counts = ledger.counts()
    print(crash.report("SIGKILL task workers", task_workers, counts, start, seconds=seconds))
    assert {run.tasks_backend for run in ledger.runs} == {worker_backend}
    # A worker claims a run to call it at once, one at a time: a threads' worth is one.
    check_promises(ledger, stopped_at, dead=task_workers.times("kill"), threads=1)
