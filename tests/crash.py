"""The crash suite's driver and auditor.

``Fleet`` keeps N real ``run_scheduler`` processes alive while it SIGKILLs one at random and
starts its replacement at once, recording a timeline on the database clock. ``Ledger`` reads
what the runs, leases and executions tables say afterwards; each of its ``*_violations``
methods returns the broken promises as readable lines (empty when the promise held).
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
from datetime import datetime, timedelta
from pathlib import Path

from django.db import connection

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
    what: str  # start, kill, stop, pg_restart
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

    def _event(self, what: str, pid: int, at: datetime | None = None) -> Event:
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
        self._event(what, child.pid)
        return child

    def start(self) -> None:
        self.live = [self.start_one() for _ in range(self.size)]

    def kill_one(self) -> LoggedChild:
        """SIGKILL a random live child and start its replacement at once."""
        victim = self.random.choice(self.live)
        os.kill(victim.pid, signal.SIGKILL)
        victim.popen.wait()
        self._event("kill", victim.pid)
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
            self._event("stop", child.pid, stopping_at)
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

    def logs(self, children: list[LoggedChild] | None = None, lines: int = 20) -> str:
        return "\n".join(
            f"--- pid {child.pid} (exit {child.popen.poll()}) ---\n{child.tail(lines)}"
            for child in children or self.started
        )


def create_schedules(
    count: int,
    start: datetime,
    *,
    seconds: float,
    lease_timeout: timedelta = LEASE_TIMEOUT,
    **fields,
) -> list[Schedule]:
    """``count`` schedules firing every second from ``start``, half of them at-least-once.

    ``bulk_create`` skips ``save()`` (and full_clean, whose lease_timeout check reads this
    process's heartbeat setting): the cursor is set here, to the first fire.
    """
    now = clock.now()
    schedules = [
        Schedule(
            name=f"crash-{i:03d}",
            job="tests.jobs.record",
            kwargs={"seconds": seconds},
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


@dataclass
class Ledger:
    """Everything the crash tests check, read once after the schedulers stopped."""

    schedules: dict[int, Schedule]
    runs: list[Run]
    leases: list[Lease]
    executions: dict[tuple[int, datetime], list[Execution]]
    runs_by_key: dict[tuple[int, datetime], list[Run]] = field(default_factory=dict)

    @classmethod
    def load(cls) -> "Ledger":
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
        return cls(schedules, runs, leases, dict(executions), dict(runs_by_key))

    def reentry(self, run: Run) -> bool:
        return self.schedules[run.schedule_id].allow_stale_reentry

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
        """allow_stale_reentry=False: no plan time's job body ran twice."""
        return [
            f"{self.schedules[key[0]]} @ {key[1]:%H:%M:%S} ran {len(found)} times: "
            f"{[(e.attempt, e.pid) for e in found]}"
            for key, found in self.executions.items()
            if not self.schedules[key[0]].allow_stale_reentry and len(found) > 1
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

    def at_most_once_failure_violations(
        self, dead: dict[int, datetime] | None, allowed_failures: set[str] = frozenset()
    ) -> list[str]:
        """allow_stale_reentry=False: a run fails only because its process died or stopped
        (``lease_expired``, ``interrupted``) or its job raised one of ``allowed_failures``.
        With ``dead`` ({pid: killed at}), a lease expired only if its holder was killed, and
        a killed holder wrote nothing after its death; every run whose holder died while its
        job ran ended ``failed`` with ``lease_expired``, and every run whose holder died
        before its job started ran again (never failed for it)."""
        problems = []
        for run in self.runs:
            if self.reentry(run) or run.status != "failed":
                continue
            if run.error_code not in {"lease_expired", "interrupted", *allowed_failures}:
                problems.append(f"run {run.pk} failed with {run.error_code!r}")
        if dead is None:
            return problems
        runs = {run.pk: run for run in self.runs}
        for lease in self.leases:
            pid = holder_pid(lease.holder)
            run = runs[lease.run_id]
            if lease.outcome == "expired":
                if pid not in dead:
                    problems.append(
                        f"lease {lease.pk} of run {run.pk} expired though its holder {pid} "
                        "was never killed (a live process lost its lease)"
                    )
                elif lease.started_at is None:
                    failed_for_it = run.attempt == lease.attempt and run.status == "failed"
                    if failed_for_it and run.error_code == "lease_expired":
                        problems.append(
                            f"run {run.pk} failed lease_expired though its job never started "
                            f"(killed holder {pid}): it should have run again"
                        )
                elif not self.reentry(run) and (run.status, run.error_code) != (
                    "failed",
                    "lease_expired",
                ):
                    problems.append(
                        f"run {run.pk} lost its killed holder {pid} while its job ran but "
                        f"ended {run.status} {run.error_code!r}, not failed lease_expired"
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

    def failed_but_never_called(self, started_file: Path) -> dict[int, list[str]]:
        """Runs failed ``lease_expired`` whose job was never called, by the pid that held the
        lease of that attempt: ``tests.jobs.note_start`` wrote a line to ``started_file``
        for every call, before anything else."""
        called = set(started_file.read_text().splitlines()) if started_file.exists() else set()
        holders = {(lease.run_id, lease.attempt): holder_pid(lease.holder) for lease in self.leases}
        found: dict[int, list[str]] = defaultdict(list)
        for run in self.runs:
            name = self.schedules[run.schedule_id].name
            if (run.status, run.error_code) == ("failed", "lease_expired") and (
                f"{name} {run.plan_time.isoformat()} {run.attempt}" not in called
            ):
                found[holders[(run.pk, run.attempt)]].append(
                    f"run {run.pk} ({name} @ {run.plan_time:%H:%M:%S})"
                )
        return dict(found)

    def skips_not_held_by_a_killed_run(self) -> list[str]:
        """Runs that did not succeed, other than fires skipped for overlap while a run of
        the same schedule that a kill interrupted was held: from its first lease's
        acquisition until its last lease's release (swept, then run again). With an atomic
        job and at-least-once reentry, that is the only way a fire may go unrun."""
        held: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
        by_run: dict[int, list[Lease]] = defaultdict(list)
        for lease in self.leases:
            by_run[lease.run_id].append(lease)
        schedule_of = {run.pk: run.schedule_id for run in self.runs}
        for run_id, leases in by_run.items():
            if any(lease.outcome == "expired" for lease in leases):
                ends = [lease.released_at or lease.expires_at for lease in leases]
                span = (min(lease.acquired_at for lease in leases), max(ends))
                held[schedule_of[run_id]].append(span)
        return [
            f"run {run.pk} ({self.schedules[run.schedule_id]} @ {run.plan_time:%H:%M:%S}):"
            f" {run.status} {run.error_code}"
            for run in self.runs
            if run.status != "succeeded"
            and not (
                (run.status, run.error_code) == ("skipped", "overlap")
                and any(a <= run.plan_time <= b for a, b in held[run.schedule_id])
            )
        ]

    def succeeded_share(self) -> float:
        return sum(run.status == "succeeded" for run in self.runs) / max(len(self.runs), 1)

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
