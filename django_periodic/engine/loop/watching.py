"""Watching runs in flight, whoever holds them: passing on cancel requests, stopping those
past their timeout, failing them past its grace (``RunsWatched``, the one rule); and when
they next need watching.

Two hold runs: a scheduler process's pool, which the loop (scheduler.py) watches each tick
(``Watcher``, which also skips runs that waited for a thread past their start deadline and
is told when news woke the loop), its process's heartbeat in housekeeping.py; and the tasks
a tasks backend's worker executes (``TaskWatcher``, a thread of its own that heartbeats each
lease too: tasks.py). What a run's timeout and cancel mean for its job lives in executor.py.
"""

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping
from datetime import datetime

from django.db import connections

from django_periodic.conf import PeriodicSettings, get_settings
from django_periodic.db import CONNECTION_ERRORS, clock
from django_periodic.engine.loop import executor, wakeups
from django_periodic.engine.loop import workers as workers_
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import leases, outcomes
from django_periodic.models import Run, SchedulerProcess

logger = logging.getLogger("django_periodic")


class RunsWatched:
    """The rule of watching runs in flight, the same for every holder: each look passes on
    a cancel request, tells a run past its timeout to stop and fails it past its grace
    (``executor.watch``); a run whose row makes watching it raise (its timeout, say) is
    watched no more: its job runs to its end, and its outcome is recorded as any other's.
    """

    def __init__(self) -> None:
        # Runs in flight whose watch raised (a bad row): watched no more, not the end of the
        # loop or of the watcher's thread.
        self._unwatched: set[Claim] = set()

    def look(
        self, runs: Mapping[Claim, StopRequest], asked: Container[int], now: datetime
    ) -> list[Claim]:
        """Watch ``runs`` at ``now`` (``asked``: the ids of those someone asked to stop);
        return those failed as timed out: their threads are given up."""
        overran = []
        for claim, stop in runs.items():
            if claim in self._unwatched:
                continue
            try:
                if executor.watch(claim, stop, now, claim.values.pk in asked):
                    overran.append(claim)
            except CONNECTION_ERRORS:
                raise
            except Exception:
                self._cannot_watch(claim)
        return overran

    def next_looks(self, claims: Iterable[Claim], now: datetime) -> list[datetime | None]:
        """When each of ``claims`` next needs a look (for its timeout)."""
        times = []
        for claim in claims:
            if claim in self._unwatched:
                continue
            try:
                times.append(executor.next_watch_at(claim, now))
            except Exception:
                self._cannot_watch(claim)
        return times

    def forget(self, held: Callable[[Claim], bool]) -> None:
        """Forget the runs watched no more that are no more ``held``."""
        for claim in list(self._unwatched):  # a copy: a task's watcher adds from its thread
            if not held(claim):
                self._unwatched.discard(claim)

    def _cannot_watch(self, claim: Claim) -> None:
        logger.exception("Run %s cannot be watched (timeout, cancel); it runs on.", claim.values.pk)
        self._unwatched.add(claim)


class Watcher:
    """The runs in flight in a scheduler process's pool: late starts, cancel requests,
    timeouts."""

    def __init__(
        self,
        *,
        using: str,
        settings: PeriodicSettings,
        pool: workers_.WorkerPool | None,
        listener: wakeups.Listener,
    ) -> None:
        self.using = using
        self.settings = settings
        self.pool = pool
        self.listener = listener
        self.runs = RunsWatched()
        # News woke the loop (not a timer, nor only capacity freed): look for cancel
        # requests this tick; without news, at the earliest at this time.monotonic().
        self.news = True
        self._next_cancel_look = 0.0

    def watch(self, process: SchedulerProcess | None, now: datetime) -> None:
        """Skip runs that waited for a thread past their start deadline; pass on cancel
        requests; stop runs past their timeout, fail them past its grace."""
        pool = self.pool
        assert pool is not None
        late = pool.withdraw_late()
        if late:
            outcomes.record([outcomes.skipped_late(claim) for claim in late], using=self.using)
        asked = self._cancel_requests(process)
        self.runs.forget(pool.holds)
        for claim in self.runs.look(pool.timed() | pool.of_runs(asked), asked, now):
            pool.abandon(claim)

    def wake_times(self, now: datetime) -> list[datetime | None]:
        """When runs in flight next need watching: a start deadline, a timeout."""
        assert self.pool is not None
        return [self.pool.next_start_deadline(), *self.runs.next_looks(self.pool.timed(), now)]

    def _cancel_requests(self, process: SchedulerProcess | None) -> set[int]:
        """The runs in flight here that someone asked to stop. Asked for when news woke the
        loop (a cancel sends a NOTIFY), else once a heartbeat interval (a poll interval
        without LISTEN): a busy loop ticks far more often, and each ask is a query."""
        assert self.pool is not None and process is not None
        news, self.news = self.news, False
        if self.pool.idle() or not (news or time.monotonic() >= self._next_cancel_look):
            return set()
        pace = (
            self.settings.HEARTBEAT_INTERVAL
            if self.listener.listening
            else self.settings.POLL_INTERVAL
        )
        self._next_cancel_look = time.monotonic() + pace.total_seconds()
        return leases.cancel_requested(process, self.using)


class TaskRun:
    """One run a task executes, watched until its job ends (``finish()``)."""

    def __init__(self, claim: Claim, stop: StopRequest, runs: RunsWatched) -> None:
        self.claim = claim
        self.stop = stop
        self.runs = runs
        self.timed_out = False
        self.done = False
        # Held while the watcher checks this run: finish() waits for a check under way.
        self.checking = threading.Lock()

    def finish(self) -> None:
        with self.checking:
            self.done = True
            self.runs.forget(lambda claim: claim is not self.claim)  # ended: held no more

    def check(self) -> float | None:
        """One heartbeat and look; seconds to the next, or None when there is nothing left
        to watch (the job ended, its lease was lost, or it timed out)."""
        with self.checking:
            if self.done:
                return None
            now = clock.now(self.claim.using)
            if not leases.extend(self.claim, now):
                self.stop.set(StopRequest.LEASE_LOST)
                return None
            run_id = self.claim.values.pk
            asked = Run.objects.using(self.claim.using).filter(
                pk=run_id, cancel_requested_at__isnull=False
            )
            ids = {run_id} if asked.exists() else set()
            self.timed_out = bool(self.runs.look({self.claim: self.stop}, ids, now))
            return None if self.timed_out else self.seconds_to_next_check(now)

    def seconds_to_next_check(self, now: datetime) -> float:
        """To the next heartbeat, or to the timeout (or the end of its grace) if sooner."""
        checks = [now + get_settings().HEARTBEAT_INTERVAL, *self.runs.next_looks([self.claim], now)]
        return max((min(at for at in checks if at is not None) - now).total_seconds(), 0.0)


class TaskWatcher:
    """What ``run_scheduler`` does for the runs its workers hold, for the runs this
    process's tasks execute: one thread, started with the first, waits for the earliest
    check due. A job that ends before its first heartbeat costs no query and no thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TaskRun]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self.runs = RunsWatched()
        self._thread = threading.Thread(target=self._run, name="periodic-watcher", daemon=True)
        self._thread.start()

    def watch(self, claim: Claim, stop: StopRequest) -> TaskRun:
        watched = TaskRun(claim, stop, self.runs)
        claimed_at = claim.db_time(time.monotonic()) or clock.now(claim.using)
        self._schedule(watched, watched.seconds_to_next_check(claimed_at))
        return watched

    def _schedule(self, watched: TaskRun, seconds: float) -> None:
        due = time.monotonic() + seconds
        with self._changed:
            heapq.heappush(self._heap, (due, next(self._order), watched))
            self._changed.notify()

    def _run(self) -> None:
        while True:
            watched = self._next_due()
            if watched.done:
                continue
            try:
                seconds = watched.check()
            except Exception:  # the database is away: try again at the next heartbeat
                logger.exception("Could not heartbeat run %s.", watched.claim.values.pk)
                seconds = get_settings().HEARTBEAT_INTERVAL.total_seconds()
            finally:
                # A check every heartbeat interval at most: a fresh connection each time
                # costs little, and none is held (or found broken) in between.
                connections.close_all()
            if seconds is not None:
                self._schedule(watched, seconds)

    def _next_due(self) -> TaskRun:
        with self._changed:
            while True:
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is not None and wait <= 0:
                    return heapq.heappop(self._heap)[2]
                self._changed.wait(wait)


_shared: TaskWatcher | None = None
_shared_lock = threading.Lock()


def task_watcher() -> TaskWatcher:
    """This process's watcher of the runs its tasks execute, started with the first."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TaskWatcher()
        return _shared
