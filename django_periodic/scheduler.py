"""The scheduler loop: plan, sweep, heartbeat, claim, then sleep until there is work.

Decisions live in planner.py and leases.py; this module only orders them in time, owns
the worker threads and the wake-ups, and survives a database that goes away.
"""

import logging
import os
import queue
import socket
import threading
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, InterfaceError, close_old_connections, connections
from django.db.models import Min

from django_periodic import clock, executor, leases, planner, registry
from django_periodic.conf import get_settings
from django_periodic.models import Run, Schedule, SchedulerProcess

logger = logging.getLogger("django_periodic")

MAX_ERROR_BACKOFF = 30.0
STALE_PROCESS_AGE = timedelta(hours=1)


class WorkerPool:
    """Threads that execute claimed runs; ``on_done`` is called after each one."""

    def __init__(self, size: int, on_done) -> None:
        self.size = size
        self._on_done = on_done
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self._in_flight: dict[leases.Claim, threading.Event] = {}
        for index in range(size):
            name = f"periodic-worker-{index}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def free(self) -> int:
        with self._lock:
            return self.size - len(self._in_flight)

    def submit(self, claim: leases.Claim) -> None:
        with self._lock:
            self._in_flight[claim] = threading.Event()
        self._queue.put(claim)

    def in_flight(self) -> list[leases.Claim]:
        with self._lock:
            return list(self._in_flight)

    def wait_idle(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: not self._in_flight, timeout)

    def cancel_all(self) -> None:
        with self._lock:
            for cancel in self._in_flight.values():
                cancel.set()

    def stop(self) -> None:
        """Let each idle thread exit; a thread still running a job exits after it."""
        for _ in range(self.size):
            self._queue.put(None)

    def _work(self) -> None:
        while (claim := self._queue.get()) is not None:
            self._execute(claim)
        connections.close_all()  # this thread's own connections

    def _execute(self, claim: leases.Claim) -> None:
        with self._lock:
            cancel = self._in_flight[claim]
        try:
            close_old_connections()
            executor.execute(claim, cancel)
        except Exception:
            # The run keeps its lease until it expires; the sweeper then settles it.
            logger.exception("Could not record the outcome of run %s.", claim.run.pk)
        finally:
            close_old_connections()
            with self._lock:
                del self._in_flight[claim]
                self._lock.notify_all()
            self._on_done()


class Scheduler:
    """One scheduler process: plans due schedules and executes runs with ``workers`` threads."""

    def __init__(self, *, workers: int, plan: bool = True, using: str = "default") -> None:
        self.using = using
        self.plan = plan
        self.settings = get_settings()
        self.process: SchedulerProcess | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failures = 0
        self.pool = WorkerPool(workers, on_done=self._wake.set) if workers else None
        self._next_sweep = self._next_heartbeat = datetime.min.replace(tzinfo=UTC)

    def request_stop(self) -> None:
        """Stop claiming and leave the loop (safe to call from a signal handler)."""
        self._stop.set()
        self._wake.set()

    def run(self, *, once: bool = False) -> None:
        """Boot, loop until stopped (or, with ``once``, until what is due now is done), stop."""
        while not self._stop.is_set() and not self._guarded(self.boot):
            pass  # the database is unreachable at start: keep trying until stopped
        if self.process is None:
            return
        try:
            self._run_once() if once else self._run_forever()
        finally:
            self.shutdown()

    def boot(self) -> None:
        """Recovery before the first tick: register, sync code schedules, sweep expired leases."""
        now = clock.now(self.using)
        if self.process is None:  # boot is retried when the database was away
            self.process = SchedulerProcess.objects.using(self.using).create(
                host=socket.gethostname(), pid=os.getpid(), started_at=now, heartbeat_at=now
            )
            logger.info("Scheduler %s starting.", self.process)
        registry.sync_code_schedules(self.using)
        self._sweep(now)
        self._next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL

    def tick(self) -> tuple[datetime, datetime]:
        """Do everything that is due now; return (now, when to wake up next)."""
        now = clock.now(self.using)
        if self.plan:
            self._plan(now)
        if now >= self._next_sweep:
            self._sweep(now)
        if now >= self._next_heartbeat:
            leases.heartbeat(self.process, now, self.using)
            self._next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL
        if self.pool and not self._stop.is_set():
            for claim in leases.claim(self.process, now, self.pool.free(), self.using):
                self.pool.submit(claim)
        return now, self._next_wake(now)

    def _plan(self, now: datetime) -> None:
        batch_size = self.settings.PLAN_BATCH_SIZE
        while True:
            result = planner.plan_due(now, using=self.using, batch_size=batch_size)
            if result.fired or result.skipped:
                logger.debug("Planned %d runs, skipped %d.", result.fired, result.skipped)
            if result.schedules < batch_size:
                return

    def _sweep(self, now: datetime) -> None:
        swept = leases.sweep(now, self.using)
        if swept.reentered or swept.failed:
            logger.warning(
                "Expired leases: %d runs re-entered, %d failed.", swept.reentered, swept.failed
            )
        stale = SchedulerProcess.objects.using(self.using).filter(
            heartbeat_at__lt=now - STALE_PROCESS_AGE
        )
        stale.delete()
        self._next_sweep = now + self.settings.SWEEP_INTERVAL

    def _next_wake(self, now: datetime) -> datetime:
        """The earliest of: next fire, next retry, next sweep, next heartbeat, the poll cap."""
        candidates = [now + self.settings.POLL_INTERVAL, self._next_sweep, self._next_heartbeat]
        if self.plan:
            fires = Schedule.objects.using(self.using).enabled()
            candidates.append(fires.aggregate(at=Min("next_fire_at"))["at"])
        if self.pool:
            retries = Run.objects.using(self.using).filter(status=Run.Status.RETRYING)
            candidates.append(retries.aggregate(at=Min("next_retry_at"))["at"])
        return min(at for at in candidates if at is not None)

    def _run_forever(self) -> None:
        while not self._stop.is_set():
            self._guarded(self._tick_and_sleep)

    def _tick_and_sleep(self) -> None:
        self._wake.clear()
        close_old_connections()
        now, wake_at = self.tick()
        self._wake.wait(max((wake_at - now).total_seconds(), 0.001))

    def _guarded(self, step) -> bool:
        """Run a step; on a database error log it, reconnect later, back off 1, 2, 4... 30 s."""
        try:
            step()
        except (DatabaseError, InterfaceError) as exc:
            self._failures += 1
            delay = min(2.0 ** (self._failures - 1), MAX_ERROR_BACKOFF)
            logger.error("Database error (%s); retrying in %.0f s.", exc, delay)
            connections.close_all()
            self._stop.wait(delay)
            return False
        self._failures = 0
        return True

    def _run_once(self) -> None:
        """Plan what is due now, run it and whatever becomes runnable, and return when idle."""
        while not self._stop.is_set():
            self._wake.clear()
            self.tick()
            if not self.pool or (self.pool.free() == self.pool.size and not self._claimable()):
                return
            self._wake.wait(1.0)

    def _claimable(self) -> bool:
        return Run.objects.using(self.using).claimable(clock.now(self.using)).exists()

    def shutdown(self) -> None:
        """Let running jobs finish within the grace, release what is left, unregister."""
        if self.pool:
            self._drain()
            self.pool.stop()
        if self.process:
            SchedulerProcess.objects.using(self.using).filter(pk=self.process.pk).delete()
            logger.info("Scheduler %s stopped.", self.process)

    def _drain(self) -> None:
        now = clock.now(self.using)
        deadline = now + self.settings.SHUTDOWN_GRACE
        while now < deadline:
            wait = min(self.settings.HEARTBEAT_INTERVAL, deadline - now)
            if self.pool.wait_idle(wait.total_seconds()):
                break
            now = clock.now(self.using)
            leases.heartbeat(self.process, now, self.using)
        self.pool.cancel_all()
        now = clock.now(self.using)
        for claim in self.pool.in_flight():
            leases.release(claim, now)
            logger.warning("Gave up run %s unfinished at shutdown.", claim.run.pk)
