"""The crash suite's driver and auditor.

``Fleet`` keeps N real ``run_scheduler`` processes alive while it SIGKILLs one at random and
starts its replacement at once, recording a timeline on the database clock. ``Ledger`` reads
what the runs, leases and executions tables say afterwards, and what the jobs noted of their
own calls (``tests.jobs.note``); each of its ``*_violations`` methods returns the broken
promises as readable lines (empty when the promise held).

Whether a job was called is judged by its note alone, written before it does anything else:
the ledger's own marks (a lease's ``started_at``, a run's status) are what is checked
against it, never the oracle.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.db import connection

from django_periodic import registry
from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from tests import processes
from tests.models import Execution

SECOND = timedelta(seconds=1)

# Fast settings for the children: a dead process's lease (3 s) expires and is swept within
# about 4 s; reentry never gives up; a graceful stop waits 2 s for jobs of a fraction of that.
CHILD_SETTINGS = {
    "HEARTBEAT_INTERVAL": 1,
    "SWEEP_INTERVAL": 1,
    "POLL_INTERVAL": 1,
    "STALE_REENTRY_LIMIT": 1_000_000,
    "SHUTDOWN_GRACE": 2,
}
# The same with the default heartbeat and sweep: recovery by detection, not fast expiry.
DEFAULT_CHILD_SETTINGS = {"STALE_REENTRY_LIMIT": 1_000_000, "SHUTDOWN_GRACE": 2}
LEASE_TIMEOUT = timedelta(seconds=3)
# A lease last extended before the database answered again (give or take a heartbeat
# interval, CHILD_SETTINGS) may expire for the outage: its holder could not extend it.
OUTAGE_SLACK = timedelta(seconds=1)
# Error codes of a job body that queried while the database was away.
DATABASE_ERRORS = frozenset({"OperationalError", "InterfaceError"})


class LoggedChild(processes.SchedulerProcess):
    """A ``run_scheduler`` (or other ``command``) child whose output goes to a file, never
    to a pipe.

    A pipe nobody reads fills up (64 KiB) and then blocks the child's next log line: over a
    minute of warnings about expired leases, that would freeze it like a crash would.
    """

    def __init__(
        self,
        *args: str,
        settings: dict,
        log_path: Path,
        command: tuple[str, ...] = processes.SchedulerProcess.COMMAND,
    ) -> None:
        self.log_path = log_path
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PERIODIC_TEST_DB_NAME": connection.settings_dict["NAME"],
            "PERIODIC_TEST_SETTINGS": json.dumps(settings),
            "PYTHONPATH": str(processes.ROOT),
        }
        argv = [sys.executable, "-m", *command, *args]
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(
                argv, env=env, cwd=processes.ROOT, stdout=log, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


@dataclass(frozen=True)
class Event:
    what: str  # start, kill, stop, recover, pg_down, pg_up
    pid: int
    at: datetime  # the database's clock, like plan times and leases
    monotonic: float


class Fleet:
    """``size`` run_scheduler processes (or ``command``'s, such as task workers), churned by
    SIGKILL and restarted at once."""

    def __init__(
        self,
        size: int,
        args: list[str],
        settings: dict,
        log_dir: Path,
        seed: int,
        command: tuple[str, ...] = processes.SchedulerProcess.COMMAND,
    ):
        self.size = size
        self.command = command
        self.args = args
        self.settings = settings
        self.log_dir = log_dir
        self.seed = seed
        self.random = random.Random(seed)
        self.live: list[LoggedChild] = []
        self.started: list[LoggedChild] = []
        self.timeline: list[Event] = []

    def event(self, what: str, pid: int = 0, at: datetime | None = None) -> Event:
        """Add ``what`` to the timeline, at the database clock's now unless ``at``."""
        event = Event(what, pid, at or clock.now(), time.monotonic())
        self.timeline.append(event)
        return event

    def start_one(self, *args: str, what: str = "start") -> LoggedChild:
        module, *rest = self.command
        label = rest[0] if module == "django" else module  # run_scheduler, db_worker, celery
        path = self.log_dir / f"{label}-{len(self.started)}.log"
        child = LoggedChild(
            *self.args, *args, settings=self.settings, log_path=path, command=self.command
        )
        self.started.append(child)
        self.event(what, child.pid)
        return child

    def start(self) -> None:
        self.live = [self.start_one() for _ in range(self.size)]

    def kill_one(self, victim: LoggedChild | None = None) -> LoggedChild:
        """SIGKILL ``victim`` (else a random live child) and start its replacement at once."""
        victim = victim or self.random.choice(self.live)
        os.kill(victim.pid, signal.SIGKILL)
        victim.popen.wait()
        self.event("kill", victim.pid)
        self.live.remove(victim)
        self.live.append(self.start_one())
        return victim

    def churn(self, until: float, every: tuple[float, float] = (2.0, 4.0)) -> None:
        """Kill and restart every 2-4 s (seeded) until ``time.monotonic()`` reaches ``until``."""
        while True:
            pause = self.random.uniform(*every)
            time.sleep(max(min(pause, until - time.monotonic()), 0))  # the workload
            if time.monotonic() >= until:
                return
            self.kill_one()

    def stop(self, timeout: float = 60) -> dict[int, int]:
        """SIGTERM every live child at once; wait for all; return {pid: exit code}."""
        stopping_at = clock.now()
        for child in self.live:
            child.popen.send_signal(signal.SIGTERM)
            self.event("stop", child.pid, stopping_at)
        codes = {child.pid: child.wait(timeout) for child in self.live}
        self.live = []
        return codes

    def reap(self) -> None:
        for child in self.started:
            child.kill()

    def pid_set(self, what: str) -> set[int]:
        return {event.pid for event in self.timeline if event.what == what}

    def first(self, what: str) -> Event:
        return next(event for event in self.timeline if event.what == what)

    def times(self, what: str) -> dict[int, datetime]:
        return {event.pid: event.at for event in self.timeline if event.what == what}

    def outages(self) -> list[tuple[datetime, datetime]]:
        """(down, up) of each restart of the database: from just before it was asked to
        stop until it answered again."""
        downs = [event.at for event in self.timeline if event.what == "pg_down"]
        ups = [event.at for event in self.timeline if event.what == "pg_up"]
        return list(zip(downs, ups, strict=True))

    def logs(self, children: list[LoggedChild] | None = None, lines: int = 20) -> str:
        return "\n".join(
            f"--- pid {child.pid} (exit {child.popen.poll()}) ---\n{child.tail(lines)}"
            for child in children or self.started
        )


def reaped(fleet: Fleet):
    """A fleet fixture's body: yield ``fleet``, then kill every child it started and wait
    until their database sessions have ended."""
    yield fleet
    fleet.reap()
    processes.wait_for_children_to_disconnect()


def create_schedules(
    count: int,
    start: datetime,
    *,
    seconds: float,
    notes: Path,
    job: str = "tests.jobs.record",
    lease_timeout: timedelta = LEASE_TIMEOUT,
    **fields,
) -> list[Schedule]:
    """``count`` schedules firing every second from ``start``, half of them at-least-once,
    their job noting each call in the file ``notes`` first, then taking ``seconds``, then
    writing its Execution row (``tests.jobs.record``).

    ``bulk_create`` skips ``save()`` (and full_clean, whose lease_timeout check reads this
    process's heartbeat setting): the cursor is set here, to the first fire.
    """
    now = clock.now()
    schedules = [
        Schedule(
            name=f"crash-{i:03d}",
            job=job,
            kwargs={"seconds": seconds, "notes": str(notes)},
            interval=SECOND,
            start_at=start,
            next_fire_at=start,
            lease_timeout=lease_timeout,
            allow_stale_reentry=i % 2 == 1,
            created_at=now,
            **fields,
        )
        for i in range(count)
    ]
    return Schedule.objects.bulk_create(schedules)


def wait_until_registered(fleet: Fleet, timeout: float = 60) -> None:
    def registered() -> bool:
        pids = set(SchedulerProcess.objects.values_list("pid", flat=True))
        return {child.pid for child in fleet.live} <= pids

    processes.wait_for(registered, timeout, f"{fleet.size} schedulers to register", poll=0.2)


def wait_for_leases_to_expire(timeout: float = 30) -> None:
    """Until no unreleased lease is still valid on the database's clock."""

    def expired() -> bool:
        return not Lease.objects.filter(released_at__isnull=True, expires_at__gte=clock.now())

    processes.wait_for(expired, timeout, "the leases of killed processes to expire", poll=0.2)


def holder_pid(holder: str) -> int:
    """The pid in a lease's holder: "host:pid", or "host:pid (task)" for a task's worker."""
    return int(holder.rsplit(":", 1)[1].split()[0])


@dataclass(frozen=True)
class Note:
    """A call of a job, as the job noted it before anything else (``tests.jobs.note``)."""

    run: int
    attempt: int
    pid: int
    at: datetime  # the machine's clock, which is the database's: the server runs here


def read_notes(path: Path) -> dict[tuple[int, int], list[Note]]:
    """The notes in ``path`` by (run, attempt): one per call."""
    notes = defaultdict(list)
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        run, attempt, pid, at, *_ = line.split()
        note = Note(int(run), int(attempt), int(pid), datetime.fromtimestamp(float(at), UTC))
        notes[(note.run, note.attempt)].append(note)
    return dict(notes)


# The server takes a commit's time before it flushes the commit to disk; the others see it
# only after. A run ended that long before a fire may still have looked active to its
# planner: 6 ms was seen while PostgreSQL restarted. Fires are a second apart, so a skip
# with no run active still fails by far more.
COMMIT_VISIBLE_WITHIN = timedelta(milliseconds=250)


def commit_times(table: str) -> dict[int, datetime]:
    """When the transaction that last wrote each row of ``table`` committed, by id."""
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, pg_xact_commit_timestamp(xmin) FROM "{table}"')
        return dict(cursor.fetchall())


@dataclass
class Ledger:
    """Everything the crash tests check, read once after the schedulers stopped."""

    schedules: dict[int, Schedule]
    runs: list[Run]
    leases: list[Lease]
    executions: dict[tuple[int, datetime], list[Execution]]
    # What the jobs noted of their calls, by (run, attempt).
    notes: dict[tuple[int, int], list[Note]] = field(default_factory=dict)
    # When each run's row was last written, committed: the server's own record of the
    # transaction (track_commit_timestamp, scripts/lib/postgres.sh), not a column we write.
    committed: dict[int, datetime] = field(default_factory=dict)
    runs_by_key: dict[tuple[int, datetime], list[Run]] = field(default_factory=dict)

    @classmethod
    def load(cls, notes: Path) -> "Ledger":
        schedules = {s.pk: s for s in Schedule.objects.all()}
        by_name = {s.name: s.pk for s in schedules.values()}
        runs = list(Run.objects.order_by("schedule_id", "plan_time"))
        leases = list(Lease.objects.order_by("run_id", "attempt"))
        executions = defaultdict(list)
        for execution in Execution.objects.all():
            executions[(by_name[execution.schedule], execution.plan_time)].append(execution)
        runs_by_key = defaultdict(list)
        for run in runs:
            runs_by_key[(run.schedule_id, run.plan_time)].append(run)
        return cls(
            schedules,
            runs,
            leases,
            dict(executions),
            read_notes(notes),
            commit_times(Run._meta.db_table),
            dict(runs_by_key),
        )

    def reentry(self, run: Run) -> bool:
        return self.schedules[run.schedule_id].allow_stale_reentry

    def atomic(self, run: Run) -> bool:
        return registry.is_atomic(self.schedules[run.schedule_id].job)

    def may_run_again(self, run: Run) -> bool:
        """Whether an attempt whose job was called may be followed by another."""
        return self.reentry(run) or self.atomic(run)

    def called(self, run: Run, attempt: int) -> bool:
        return (run.pk, attempt) in self.notes

    def _name(self, run: Run) -> str:
        return f"run {run.pk} ({self.schedules[run.schedule_id]} @ {run.plan_time:%H:%M:%S})"

    # -- the promises -----------------------------------------------------------------------

    def duplicate_run_violations(self) -> list[str]:
        """One run row per (schedule, plan time), and only scheduled fires."""
        problems = [
            f"{len(runs)} runs for {self.schedules[key[0]]} @ {key[1]:%H:%M:%S}"
            for key, runs in self.runs_by_key.items()
            if len(runs) > 1
        ]
        problems += [
            f"run {r.pk} has trigger {r.trigger}" for r in self.runs if r.trigger != "schedule"
        ]
        return problems

    def missing_plan_time_violations(self, planning_until: datetime, slack: timedelta) -> list[str]:
        """Every second from the first fire to the cursor is a run, each exactly once; the
        cursor reached ``planning_until`` (less ``slack``, the planning lag allowed); no plan
        time was skipped as missed."""
        problems = []
        times = defaultdict(list)
        for run in self.runs:
            times[run.schedule_id].append(run.plan_time)
        for schedule in self.schedules.values():
            cursor = schedule.next_fire_at
            count = round((cursor - schedule.start_at) / SECOND)
            expected = [schedule.start_at + k * SECOND for k in range(count)]
            got = times[schedule.pk]
            if got != expected:
                missing = sorted(set(expected) - set(got))
                extra = sorted(set(got) - set(expected))
                problems.append(
                    f"{schedule}: plan times {len(got)} != {len(expected)} up to its cursor "
                    f"{cursor:%H:%M:%S}; missing {[f'{t:%H:%M:%S}' for t in missing[:5]]}, "
                    f"unexpected {[f'{t:%H:%M:%S}' for t in extra[:5]]}"
                )
            if cursor < planning_until - slack:
                problems.append(
                    f"{schedule}: cursor {cursor:%H:%M:%S.%f} fell behind: planners were alive "
                    f"until {planning_until:%H:%M:%S.%f}"
                )
        problems += [
            f"{self.schedules[r.schedule_id]} @ {r.plan_time:%H:%M:%S} skipped as missed"
            for r in self.runs
            if r.status == "skipped" and r.error_code == "missed"
        ]
        return problems

    def unsettled_violations(self) -> list[str]:
        """No run active (in particular none ``running``) and no lease held."""
        problems = [
            f"run {r.pk} ({self.schedules[r.schedule_id]} @ {r.plan_time:%H:%M:%S}) is {r.status}"
            for r in self.runs
            if r.status in Run.ACTIVE_STATUSES
        ]
        problems += [
            f"lease {lease.pk} of run {lease.run_id} (holder {lease.holder}) is still held"
            for lease in self.leases
            if lease.released_at is None
        ]
        return problems

    def at_most_once_violations(self) -> list[str]:
        """allow_stale_reentry=False (and not atomic): no plan time's job was called twice,
        by the jobs' own notes."""
        calls: dict[int, list[Note]] = defaultdict(list)
        for (run_id, _), notes in self.notes.items():
            calls[run_id] += notes
        return [
            f"{self._name(run)} was called {len(calls[run.pk])} times: "
            f"{[(note.attempt, note.pid) for note in calls[run.pk]]}"
            for run in self.runs
            if not self.may_run_again(run) and len(calls[run.pk]) > 1
        ]

    def at_least_once_violations(self, allowed_failures: set[str] = frozenset()) -> list[str]:
        """allow_stale_reentry=True: every plan time not skipped succeeded, and its final
        attempt's job body left its Execution row. ``allowed_failures``: error codes of runs
        whose job itself raised (e.g. while the database was away), reported, not violations.
        """
        problems = []
        for run in self.runs:
            if not self.reentry(run) or run.status == "skipped":
                continue
            if run.status == "failed" and run.error_code in allowed_failures:
                continue
            found = self.executions.get((run.schedule_id, run.plan_time), [])
            if run.status != "succeeded":
                problems.append(
                    f"reentry run {run.pk} ({self.schedules[run.schedule_id]} @ "
                    f"{run.plan_time:%H:%M:%S}) ended {run.status} {run.error_code!r}"
                )
            elif run.attempt not in {e.attempt for e in found}:
                problems.append(
                    f"reentry run {run.pk} succeeded at attempt {run.attempt} without its "
                    f"Execution row (found attempts {[e.attempt for e in found]})"
                )
        return problems

    def orphan_execution_violations(self) -> list[str]:
        """An Execution row belongs to a run that was claimed at least that many times."""
        problems = []
        for key, found in self.executions.items():
            runs = self.runs_by_key.get(key, [])
            if not runs:
                problems.append(f"execution without a run: {self.schedules[key[0]]} @ {key[1]}")
            elif max(e.attempt for e in found) > runs[0].attempt:
                problems.append(f"execution of an attempt never claimed: run {runs[0].pk}")
        return problems

    def call_violations(self, job_failures: set[str] = frozenset()) -> list[str]:
        """Every call the jobs noted was of an attempt the ledger claimed and says started
        (not for an atomic job, which is never marked), by the process that held it, once;
        and how its run ended accounts for it: that attempt succeeded, or failed as its job
        raised one of ``job_failures``, or its process died or stopped under it
        (``lease_expired``, ``interrupted``); or, where the schedule allows (reentry, or an
        atomic job), the run was run again. So a call is never lost, nor hidden by a later
        attempt of an at-most-once schedule."""
        runs = {run.pk: run for run in self.runs}
        leases = {(lease.run_id, lease.attempt): lease for lease in self.leases}
        problems = []
        for (run_id, attempt), notes in self.notes.items():
            run, lease = runs.get(run_id), leases.get((run_id, attempt))
            if run is None or lease is None:
                problems.append(
                    f"run {run_id} attempt {attempt} was called (pid {notes[0].pid}), "
                    "but the ledger never claimed it"
                )
                continue
            name = f"{self._name(run)} attempt {attempt}"
            if len(notes) > 1:
                problems.append(f"{name} was called {len(notes)} times under one lease")
            if {note.pid for note in notes} != {holder_pid(lease.holder)}:
                problems.append(
                    f"{name} was called by {[note.pid for note in notes]}, "
                    f"its lease held by {lease.holder}"
                )
            if lease.started_at is None and not self.atomic(run):
                problems.append(f"{name} was called, yet its lease says it never started")
            if not self._accounts_for_a_call(run, lease, job_failures):
                problems.append(
                    f"{name} was called, yet its lease ended {lease.outcome!r} and its run "
                    f"{run.status} {run.error_code!r} at attempt {run.attempt}"
                )
        return problems

    def _accounts_for_a_call(self, run: Run, lease: Lease, job_failures: set[str]) -> bool:
        last = run.attempt == lease.attempt
        if lease.outcome == "succeeded":
            return last and run.status == "succeeded"
        if lease.outcome == "failed":
            return last and run.status == "failed" and run.error_code in job_failures
        if lease.outcome == "retry":
            return not last
        if lease.outcome in {"expired", "released", "interrupted"}:
            if not last:
                return self.may_run_again(run)
            stopped = run.status == "failed" and run.error_code in {"lease_expired", "interrupted"}
            return stopped and not self.may_run_again(run)
        return False  # skipped, cancelled, timeout, or still held: not a call's end

    def success_violations(self) -> list[str]:
        """A run that succeeded was called at its last attempt (by the job's note), and that
        attempt left exactly one Execution row: no plan time has two successful effects."""
        problems = []
        for run in self.runs:
            if run.status != "succeeded":
                continue
            if not self.called(run, run.attempt):
                problems.append(
                    f"{self._name(run)} succeeded, yet attempt {run.attempt} was never called"
                )
            rows = [e.attempt for e in self.executions.get((run.schedule_id, run.plan_time), [])]
            if rows.count(run.attempt) != 1:
                problems.append(
                    f"{self._name(run)} succeeded at attempt {run.attempt} with "
                    f"{rows.count(run.attempt)} Execution rows of it (rows of attempts {rows})"
                )
        return problems

    def lease_violations(
        self,
        dead: dict[int, datetime],
        outages: list[tuple[datetime, datetime]] = (),
        allowed_failures: set[str] = frozenset(),
    ) -> list[str]:
        """A run fails only because its process died or stopped (``lease_expired``,
        ``interrupted``) or its job raised one of ``allowed_failures``. A lease expired only
        if its holder was killed (``dead``: {pid: killed at}) or the database was away
        (``outages``: [(down, up)]) when it was due to be extended; a killed holder released
        nothing after its death; and a run whose lease expired while the ledger said its job
        had not started (no ``started_at``) ran again, whatever its schedule's policy. (What
        became of a run whose job was called is ``call_violations``' business: by the
        notes.)"""
        problems = [
            f"{self._name(run)} failed with {run.error_code!r}"
            for run in self.runs
            if run.status == "failed"
            and run.error_code not in {"lease_expired", "interrupted", *allowed_failures}
        ]
        runs = {run.pk: run for run in self.runs}
        for lease in self.leases:
            pid = holder_pid(lease.holder)
            run = runs[lease.run_id]
            if lease.outcome == "expired":
                # Extended last before the database came back, due after it went away.
                away = any(
                    lease.heartbeat_at <= up + OUTAGE_SLACK and lease.expires_at >= down
                    for down, up in outages
                )
                if pid not in dead and not away:
                    problems.append(
                        f"lease {lease.pk} of {self._name(run)} expired though its holder "
                        f"{pid} was never killed, nor the database away (a live process lost "
                        "its lease)"
                    )
                elif lease.started_at is None and (run.attempt, run.status) == (
                    lease.attempt,
                    "failed",
                ):
                    problems.append(
                        f"{self._name(run)} failed {run.error_code!r} though its lease says "
                        f"its job never started (holder {pid}): it should have run again"
                    )
            elif pid in dead and lease.released_at and lease.released_at > dead[pid]:
                problems.append(
                    f"lease {lease.pk} released ({lease.outcome}) at {lease.released_at} by "
                    f"{pid}, which was killed at {dead[pid]}"
                )
        return problems

    def exactly_once_effect_violations(self) -> list[str]:
        """Atomic jobs: a succeeded run left exactly one Execution row, its last attempt's;
        any other run none (what a failed or cut-off attempt wrote rolled back)."""
        problems = []
        for run in self.runs:
            found = self.executions.get((run.schedule_id, run.plan_time), [])
            wanted = [run.attempt] if run.status == "succeeded" else []
            if [e.attempt for e in found] != wanted:
                problems.append(
                    f"run {run.pk} ({self.schedules[run.schedule_id]} @ "
                    f"{run.plan_time:%H:%M:%S}) ended {run.status} at attempt {run.attempt} "
                    f"with rows of attempts {[e.attempt for e in found]}"
                )
        return problems

    # -- what happened ----------------------------------------------------------------------

    def recovery_seconds(self, dead: dict[int, datetime]) -> list[float]:
        """For each killed process that held leases: seconds from its SIGKILL until the last
        of them was released by another process (its runs recovered)."""
        last_release: dict[int, datetime] = {}
        for lease in self.leases:
            pid = holder_pid(lease.holder)
            if pid in dead and lease.outcome == "expired" and lease.released_at:
                last_release[pid] = max(last_release.get(pid, lease.released_at), lease.released_at)
        return sorted((at - dead[pid]).total_seconds() for pid, at in last_release.items())

    def failed_uncalled(self) -> dict[int, list[str]]:
        """Runs failed because their process died or stopped (``lease_expired``,
        ``interrupted``) though their last attempt's job was never called (no note), by the
        pid that held that attempt's lease: the ledger marked them started, and the call
        that was to follow never came."""
        holders = {(lease.run_id, lease.attempt): holder_pid(lease.holder) for lease in self.leases}
        found: dict[int, list[str]] = defaultdict(list)
        for run in self.runs:
            stopped = run.status == "failed" and run.error_code in {"lease_expired", "interrupted"}
            if stopped and not self.called(run, run.attempt):
                found[holders[(run.pk, run.attempt)]].append(self._name(run))
        return dict(found)

    def failed_outside(self, windows: list[tuple[datetime, datetime]]) -> list[str]:
        """Failed runs whose last attempt's job was not called within one of ``windows``,
        by its note (nor at all)."""
        problems = []
        for run in self.runs:
            if run.status != "failed":
                continue
            notes = self.notes.get((run.pk, run.attempt), [])
            if not any(start <= note.at <= end for note in notes for start, end in windows):
                called = f"called at {notes[0].at:%H:%M:%S.%f}" if notes else "never called"
                problems.append(f"{self._name(run)} failed {run.error_code!r}, {called}")
        return problems

    def thin_plan_time_violations(
        self, windows: list[tuple[datetime, datetime]], share: float
    ) -> list[str]:
        """Plan times within one of ``windows`` at which fewer than ``share`` of the runs
        succeeded."""
        runs_at: dict[datetime, list[Run]] = defaultdict(list)
        for run in self.runs:
            if any(start <= run.plan_time <= end for start, end in windows):
                runs_at[run.plan_time].append(run)
        problems = []
        for at, runs in sorted(runs_at.items()):
            succeeded = sum(run.status == "succeeded" for run in runs)
            if succeeded < share * len(runs):
                statuses = Counter(f"{run.status} {run.error_code}".strip() for run in runs)
                problems.append(f"@ {at:%H:%M:%S}: {succeeded} of {len(runs)} ({dict(statuses)})")
        return problems

    def skip_violations(self) -> list[str]:
        """Runs skipped other than for overlap behind a run of their schedule planned before
        them and still active when they were planned.

        A planner reads its clock (the skipped run's ``created_at``), then what is active:
        a run it saw active ended in a transaction that others saw committed after that
        reading. The server's commit time of the run's last write is the judge, not the
        ``finished_at`` its writer read before committing (which a loaded machine can delay
        by any amount); within ``COMMIT_VISIBLE_WITHIN``, as that time is taken before the
        commit's flush to disk.
        """
        problems = []
        unskipped: dict[int, list[Run]] = defaultdict(list)  # by schedule, by plan time
        for run in self.runs:
            if run.status != "skipped":
                unskipped[run.schedule_id].append(run)
        for run in self.runs:
            if run.status != "skipped":
                continue
            before = [
                other for other in unskipped[run.schedule_id] if other.plan_time < run.plan_time
            ]
            if run.error_code == "overlap" and any(self._active_at(o, run) for o in before):
                continue
            blocker = before[-1] if before else None
            ended = f"{self.committed[blocker.pk]:%H:%M:%S.%f}" if blocker else "-"
            problems.append(
                f"{self._name(run)} planned at {run.created_at:%H:%M:%S.%f}: skipped "
                f"{run.error_code!r}; the run before it, "
                f"{self._name(blocker) if blocker else 'none'}, last committed at {ended}"
            )
        return problems

    def _active_at(self, blocker: Run, run: Run) -> bool:
        """Whether ``blocker`` was planned before ``run`` and still active when it was."""
        if blocker.created_at > run.created_at:
            return False
        visible_at = self.committed[blocker.pk] + COMMIT_VISIBLE_WITHIN
        return blocker.finished_at is None or visible_at >= run.created_at

    def succeeded_share(self) -> float:
        """The share of runs not skipped that succeeded. A skip behind an active run is
        ``skip_violations``' business: how many there are depends on the machine's load
        (a run slowed past its second makes the next fire wait), not on recovery."""
        ran = [run for run in self.runs if run.status != "skipped"]
        return sum(run.status == "succeeded" for run in ran) / max(len(ran), 1)

    def counts(self) -> dict:
        statuses = Counter(r.status for r in self.runs)
        reasons = Counter(
            f"{r.status}:{r.error_code}" for r in self.runs if r.status in {"skipped", "failed"}
        )
        duplicates = Counter(
            "reentry" if self.schedules[key[0]].allow_stale_reentry else "at-most-once"
            for key, found in self.executions.items()
            if len(found) > 1
        )
        expired = [lease for lease in self.leases if lease.outcome == "expired"]
        lags = [r.created_at - r.plan_time for r in self.runs]
        sweep_delays = [lease.released_at - lease.expires_at for lease in expired]
        return {
            "schedules": len(self.schedules),
            "runs": len(self.runs),
            "statuses": dict(sorted(statuses.items())),
            "failed/skipped reasons": dict(sorted(reasons.items())),
            "executions": sum(len(found) for found in self.executions.values()),
            "plan times executed": len(self.executions),
            "duplicate executions": dict(duplicates),
            "leases": len(self.leases),
            "leases expired": len(expired),
            "re-entered runs": sum(1 for r in self.runs if self.reentry(r) and r.interruptions),
            "max plan lag s": round(max(lags, default=timedelta(0)).total_seconds(), 3),
            "max sweep delay s": round(max(sweep_delays, default=timedelta(0)).total_seconds(), 3),
        }


def report(title: str, fleet: Fleet, ledger_counts: dict, origin: datetime, **extra) -> str:
    """What a run counted, and its timeline in seconds after ``origin`` (the first fire)."""
    kills = [event for event in fleet.timeline if event.what == "kill"]
    restarts = len(fleet.pid_set("start")) - fleet.size
    timeline = ", ".join(
        f"{event.what} {event.pid} {(event.at - origin).total_seconds():+.1f}"
        for event in fleet.timeline
    )
    lines = [
        f"{title}: seed {fleet.seed}, {len(kills)} kills, {restarts} restarts",
        *(f"  {key}: {value}" for key, value in {**extra, **ledger_counts}.items()),
        f"  timeline (s after the first fire): {timeline}",
    ]
    return "\n".join(lines)


def fail_if(problems: list[str], what: str, limit: int = 10) -> None:
    """Fail with the first ``limit`` problems listed (none: the promise held)."""
    if problems:
        shown = "\n  ".join(problems[:limit])
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise AssertionError(f"{what}: {len(problems)} violations\n  {shown}{more}")
