"""The scheduler loop: plan, sweep, heartbeat, claim, then sleep until there is work.

Decisions live in planner.py and leases.py; this module only orders them in time, owns
the worker threads and the wake-ups, and survives a database that goes away.
"""

import logging
import os
import queue
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, InterfaceError, close_old_connections, connections
from django.db.models import Min

from django_periodic import clock, executor, leases, planner, sync, wakeups
from django_periodic.conf import get_settings
from django_periodic.context import StopRequest
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.stop_signals import StopSignals

logger = logging.getLogger("django_periodic")

MAX_ERROR_BACKOFF = 30.0


class WorkerPool:
    """Threads that execute claimed runs; ``on_done`` is called after each one."""

    def __init__(self, size: int, on_done) -> None:
        self.size = size
        self._on_done = on_done
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self._in_flight: dict[leases.Claim, StopRequest] = {}
        self._abandoned: set[leases.Claim] = set()
        self._threads = 0
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        self._threads += 1
        name = f"periodic-worker-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def free(self) -> int:
        with self._lock:
            return self.size - len(self._in_flight)

    def submit(self, claim: leases.Claim) -> None:
        with self._lock:
            self._in_flight[claim] = StopRequest()
        self._queue.put(claim)

    def in_flight(self) -> dict[leases.Claim, StopRequest]:
        with self._lock:
            return dict(self._in_flight)

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

    def stop_all(self, reason: str) -> None:
        with self._lock:
            for stop in self._in_flight.values():
                stop.set(reason)

    def abandon(self, claim: leases.Claim) -> None:
        """Stop counting a run whose job overran: a new thread takes its place.

        Python cannot kill a thread; the old one ends when its job returns, and its
        late outcome is refused by the lease's token.
        """
        with self._lock:
            if self._in_flight.pop(claim, None) is None:
                return
            self._abandoned.add(claim)
            self._lock.notify_all()
            self._start_thread()

    def stop(self) -> None:
        """Let each idle thread exit; a thread still running a job exits after it."""
        for _ in range(self.size):
            self._queue.put(None)

    def _work(self) -> None:
        while (claim := self._queue.get()) is not None:
            self._execute(claim)
            with self._lock:
                if claim in self._abandoned:
                    self._abandoned.discard(claim)
                    break  # its replacement already serves the queue
        connections.close_all()  # this thread's own connections

    def _execute(self, claim: leases.Claim) -> None:
        with self._lock:
            stop = self._in_flight[claim]
        try:
            close_old_connections()
            executor.execute(claim, stop)
        except BaseException:
            # Never lose the thread. The run keeps its lease until it expires (its
            # heartbeat stops below, with its claim); the sweeper then settles it.
            logger.exception("Could not record the outcome of run %s.", claim.run.pk)
        finally:
            close_old_connections()
            with self._lock:
                self._in_flight.pop(claim, None)
                self._lock.notify_all()
            self._on_done()


class Scheduler:
    """One scheduler process: plans due schedules and executes runs with ``workers`` threads."""

    def __init__(
        self,
        *,
        workers: int,
        plan: bool = True,
        using: str = "default",
        stop: StopSignals | None = None,
    ) -> None:
        self.using = using
        self.plan = plan
        self.settings = get_settings()
        self.process: SchedulerProcess | None = None
        self.stop = stop or StopSignals()
        # One alarm ends every sleep: a stop signal, a NOTIFY, a finished job.
        self._alarm = self.stop.alarm
        self._failures = 0
        self.pool = WorkerPool(workers, on_done=self._alarm.set) if workers else None
        self.listener = wakeups.Listener(using, self._alarm)
        self._next_sweep = self._next_heartbeat = datetime.min.replace(tzinfo=UTC)
        self._clock_read_at = 0.0  # time.monotonic() when the last tick read the clock

    def request_stop(self) -> None:
        """Stop claiming and leave the loop; a second request stops waiting for jobs."""
        self.stop.request()

    def run(self, *, once: bool = False) -> None:
        """Boot, loop until stopped (or, with ``once``, until what is due now is done), stop."""
        while not self.stop.requested and not self._guarded(self.boot):
            pass  # the database is unreachable at start: keep trying until stopped
        if self.process is None:
            return
        if not once and not self.listener.start():
            logger.info("No LISTEN/NOTIFY on this database: polling every %s.", self.poll)
        try:
            self._run_once() if once else self._run_forever()
        finally:
            # With the database away, what shutdown cannot record is left to the leases.
            self._guarded(self.shutdown)

    @property
    def poll(self) -> timedelta:
        return self.settings.POLL_INTERVAL

    def boot(self) -> None:
        """Recovery, before the first tick and logged: register, sync code schedules, settle
        the runs of processes that died, then plan what came due while nobody was planning."""
        now = clock.now(self.using)
        if self.process is None:  # boot is retried when the database was away
            self.process = SchedulerProcess.objects.using(self.using).create(
                host=socket.gethostname(), pid=os.getpid(), started_at=now, heartbeat_at=now
            )
            logger.info("Scheduler %s starting; recovery first.", self.process)
        sync.sync_code_schedules(self.using)
        swept = self._sweep(now)
        planned = self._plan(now) if self.plan else planner.PlanResult()
        logger.info(
            "Recovery done: %d runs of dead processes re-entered, %d failed (lease expired); "
            "%d runs fired (%d late, by misfire policy), %d plan times skipped; "
            "%d schedules could not be planned.",
            swept.reentered,
            swept.failed,
            planned.fired,
            planned.late,
            planned.skipped,
            len(planned.failed),
        )
        self._next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL

    def tick(self) -> tuple[datetime, datetime]:
        """Do everything that is due now; return (now, when to wake up next)."""
        now = clock.now(self.using)
        self._clock_read_at = time.monotonic()
        # Heartbeat first: after an outage longer than a lease, the sweep must not find
        # this process's own live runs expired.
        if now >= self._next_heartbeat:
            leases.heartbeat(self.process, now, self.using)
            self._next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL
        fired = self._plan(now).fired if self.plan else 0
        if now >= self._next_sweep:
            self._sweep(now)
        claimed = 0
        if self.pool:
            self._watch_running(now)
            if not self.stop.requested:
                claimed = self._claim(now)
        if fired > claimed:
            wakeups.notify(self.using)  # runs are left: let other processes take them
        return now, self._next_wake(now)

    def _claim(self, now: datetime) -> int:
        claims = leases.claim(self.process, now, self.pool.free(), self.using)
        for claim in claims:
            self.pool.submit(claim)
        return len(claims)

    def _watch_running(self, now: datetime) -> None:
        """Pass on cancel requests; stop runs past their timeout, fail them past its grace."""
        in_flight = self.pool.in_flight()
        asked = leases.cancel_requested(in_flight, self.using)
        for claim, stop in in_flight.items():
            if claim.run.pk in asked:
                stop.set(StopRequest.CANCEL)
            deadline = self._timeout_at(claim)
            if deadline is None or now < deadline:
                continue
            stop.set(StopRequest.TIMEOUT)
            if now >= deadline + self.settings.TIMEOUT_GRACE and leases.timed_out(claim, now):
                logger.error("Run %s timed out; its worker thread is replaced.", claim.run.pk)
                self.pool.abandon(claim)

    @staticmethod
    def _timeout_at(claim: leases.Claim) -> datetime | None:
        timeout = claim.run.schedule.timeout
        return None if timeout is None else claim.run.started_at + timeout

    def _plan(self, now: datetime) -> planner.PlanResult:
        batch_size = self.settings.PLAN_BATCH_SIZE
        total = planner.PlanResult()
        while True:
            result = planner.plan_due(now, using=self.using, batch_size=batch_size)
            total += result
            if result.fired or result.skipped:
                logger.debug("Planned %d runs, skipped %d.", result.fired, result.skipped)
            if result.schedules < batch_size:
                return total

    def _sweep(self, now: datetime) -> leases.SweepResult:
        swept = leases.sweep(now, self.using)
        if swept.reentered or swept.failed:
            logger.warning(
                "Expired leases: %d runs re-entered, %d failed.", swept.reentered, swept.failed
            )
        leases.promote_queued(None, self.using)
        SchedulerProcess.objects.using(self.using).stale(now).forgettable().delete()
        self._next_sweep = now + self.settings.SWEEP_INTERVAL
        return swept

    def _next_wake(self, now: datetime) -> datetime:
        """The earliest of: next fire, retry, sweep, heartbeat and timeout; the poll cap."""
        candidates = [now + self.poll, self._next_sweep, self._next_heartbeat]
        if self.plan:
            fires = Schedule.objects.using(self.using).enabled()
            candidates.append(fires.aggregate(at=Min("next_fire_at"))["at"])
        if self.pool:
            retries = Run.objects.using(self.using).filter(status=Run.Status.RETRYING)
            candidates.append(retries.aggregate(at=Min("next_retry_at"))["at"])
            for claim in self.pool.in_flight():
                timeout_at = self._timeout_at(claim)
                if timeout_at is not None:
                    grace = self.settings.TIMEOUT_GRACE if timeout_at <= now else timedelta(0)
                    candidates.append(timeout_at + grace)
        return min(at for at in candidates if at is not None)

    def _run_forever(self) -> None:
        while not self.stop.requested:
            self._guarded(self._tick_and_sleep)

    def _tick_and_sleep(self) -> None:
        self._alarm.clear()
        close_old_connections()
        now, wake_at = self.tick()
        # The clock was read at the start of the tick: the tick's own time is already spent.
        spent = time.monotonic() - self._clock_read_at
        self._alarm.wait(max((wake_at - now).total_seconds() - spent, 0.001))

    def _guarded(self, step) -> bool:
        """Run a step; on a database error log it, reconnect later, back off 1, 2, 4... 30 s."""
        try:
            step()
        except (DatabaseError, InterfaceError) as exc:
            self._failures += 1
            delay = min(2.0 ** (self._failures - 1), MAX_ERROR_BACKOFF)
            logger.error("Database error (%s); retrying in %.0f s.", exc, delay)
            connections.close_all()
            self._sleep_unless_stopped(delay)
            return False
        self._failures = 0
        return True

    def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.requested and (left := deadline - time.monotonic()) > 0:
            self._alarm.wait(left)

    def _run_once(self) -> None:
        """Plan what is due now, run it and whatever becomes runnable, and return when idle."""
        while not self.stop.requested:
            self._alarm.clear()
            self.tick()
            if not self.pool or (self.pool.free() == self.pool.size and not self._claimable()):
                return
            self._alarm.wait(1.0)

    def _claimable(self) -> bool:
        return Run.objects.using(self.using).claimable(clock.now(self.using)).exists()

    def shutdown(self) -> None:
        """Let running jobs finish within the grace, release what is left, unregister."""
        self.listener.stop()
        if self.pool:
            running = len(self.pool.in_flight())
            logger.info(
                "Stopping: %d running jobs get up to %s to finish (a second signal stops waiting).",
                running,
                self.settings.SHUTDOWN_GRACE,
            )
            self._drain()
            self.pool.stop()
        if self.process:
            SchedulerProcess.objects.using(self.using).filter(pk=self.process.pk).delete()
            logger.info("Scheduler %s stopped.", self.process)

    def _drain(self) -> None:
        """Wait out the grace for running jobs (a second stop signal ends it), then release."""
        now = clock.now(self.using)
        deadline = now + self.settings.SHUTDOWN_GRACE
        while now < deadline and not self.pool.idle() and not self.stop.hurried:
            self._alarm.wait(min(self.settings.HEARTBEAT_INTERVAL, deadline - now).total_seconds())
            now = clock.now(self.using)
            if now >= self._next_heartbeat:
                leases.heartbeat(self.process, now, self.using)
                self._next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL
        if self.stop.hurried:
            logger.warning("Second stop signal: giving up the running jobs now.")
        # Taken before the jobs are told: one that ends at once still gets released here.
        unfinished = self.pool.in_flight()
        self.pool.stop_all(StopRequest.SHUTDOWN)
        now = clock.now(self.using)
        for claim in unfinished:
            if leases.release(claim, now):
                logger.warning("Gave up run %s unfinished at shutdown.", claim.run.pk)
