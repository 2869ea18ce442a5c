"""Watching a scheduler process's runs in flight: skipping those that waited for a thread
past their start deadline, passing on cancel requests, stopping those past their timeout;
and when they next need watching.

The loop (scheduler.py) calls it each tick and tells it when news woke it; what a run's
timeout and cancel mean for its job lives in executor.py.
"""

import logging
import time
from datetime import datetime

from django_periodic.conf import PeriodicSettings
from django_periodic.db import CONNECTION_ERRORS
from django_periodic.engine.loop import executor, wakeups
from django_periodic.engine.loop import workers as workers_
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import leases, outcomes
from django_periodic.models import SchedulerProcess

logger = logging.getLogger("django_periodic")


class Watcher:
    """The runs in flight in a pool: late starts, cancel requests, timeouts."""

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
        # Runs in flight whose watch raised (a bad row): watched no more, not the loop's end.
        self._unwatched: set[Claim] = set()
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
        if self._unwatched:
            self._unwatched = {claim for claim in self._unwatched if pool.holds(claim)}
        for claim, stop in (pool.timed() | pool.of_runs(asked)).items():
            if claim in self._unwatched:
                continue
            try:
                overran = executor.watch(claim, stop, now, claim.run.pk in asked)
            except CONNECTION_ERRORS:
                raise
            except Exception:
                self._cannot_watch(claim)
                continue
            if overran:
                pool.abandon(claim)

    def wake_times(self, now: datetime) -> list[datetime | None]:
        """When runs in flight next need watching: a start deadline, a timeout."""
        assert self.pool is not None
        return [self.pool.next_start_deadline(), *self._timeouts(now)]

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

    def _cannot_watch(self, claim: Claim) -> None:
        """A run whose row makes watching it raise (its timeout, say) is watched no more:
        its job runs to its end, and its outcome is recorded as any other's."""
        logger.exception("Run %s cannot be watched (timeout, cancel); it runs on.", claim.run.pk)
        self._unwatched.add(claim)

    def _timeouts(self, now: datetime) -> list[datetime | None]:
        """When each run in flight next needs watching (for its timeout)."""
        assert self.pool is not None
        times = []
        for claim in self.pool.timed():
            if claim in self._unwatched:
                continue
            try:
                times.append(executor.next_watch_at(claim, now))
            except Exception:
                self._cannot_watch(claim)
        return times
