"""A scheduler process's housekeeping: its heartbeat, the sweep of expired leases, the
probe for leases of dead holders, each at its pace, busy while holding leases, idle not;
and, in planning processes, judging which schedules need attention (attention.py).

The loop (scheduler.py) says when to look; this module says whether each is due, does it,
and when it is next due. The statements themselves live in leases.py and presence.py.
"""

import logging
import time
from datetime import UTC, datetime, timedelta

from django.db import transaction

from django_periodic.conf import ALERT_INTERVAL_FLOOR, PeriodicSettings
from django_periodic.engine import fleet, overlap, records
from django_periodic.engine.loop import wakeups
from django_periodic.engine.loop import workers as workers_
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.planning import attention
from django_periodic.engine.runs import claims, deadlines, leases, presence
from django_periodic.models import SchedulerProcess

logger = logging.getLogger("django_periodic")

# Heartbeat and sweep wait while runs held here are released within this time, until this
# long after (a busy heartbeat takes tens to hundreds of milliseconds: measured up to 500
# ms with a thousand leases held, and a lease lasts far longer than this wait).
RELEASE_GUARD = timedelta(milliseconds=500)
AFTER_RELEASE = timedelta(milliseconds=100)
# A run is late once its deadline is behind ``now`` (deadlines.py): the database tells
# times apart to the microsecond, so the loop wakes this long after the deadline.
LATE_AFTER = timedelta(microseconds=1)


class Housekeeper:
    """When the heartbeat, the sweep and the probe for dead holders are due, and doing them."""

    def __init__(
        self,
        *,
        using: str,
        settings: PeriodicSettings,
        pool: workers_.WorkerPool | None,
        recorder: Recorder,
        listener: wakeups.Listener,
    ) -> None:
        self.using = using
        self.settings = settings
        self.pool = pool
        self.recorder = recorder
        self.listener = listener
        self.next_sweep = self.next_heartbeat = datetime.min.replace(tzinfo=UTC)
        self._next_probe = 0.0  # time.monotonic() of the next look for dead holders
        self._postponed = False  # the heartbeat and sweep due now waited for a release
        self.release_guard = RELEASE_GUARD
        self.next_attention = datetime.min.replace(tzinfo=UTC)
        # Whether the last evaluation found schedules with alerts: only then does a sleep
        # end for the next one (an app without alerts pays nothing while idle).
        self._alerts_watched = False
        # The ``now`` of the last look for late runs: deadlines before it were looked at.
        self._attended_at = datetime.min.replace(tzinfo=UTC)

    def keep_house(
        self, process: SchedulerProcess | None, now: datetime, ahead: records.Horizon
    ) -> None:
        """Heartbeat and sweep when due (idle: in the tick's one transaction, once a minute).

        While holding leases, the heartbeat commits on its own, before the sweep: it locks
        the leases it extends, and this process's workers marking runs started or recording
        outcomes wait for those locks; they must not wait for a sweep too (up to a second
        behind a large one, measured).
        """
        heartbeat = now >= self.next_heartbeat
        sweep = now >= self.next_sweep or ahead.lease_expired()
        if not (heartbeat or sweep):
            return
        if not self._postponed and (after := self._release_soon()) is not None:
            # Runs held for their plan time are about to be marked started and released:
            # the heartbeat locks their leases (the marks would wait for it, and the jobs
            # for the marks), and the sweep takes time from the burst. Both come after it,
            # once: a process whose releases never stop must not go without a heartbeat.
            self._postponed = True
            self.next_heartbeat = max(self.next_heartbeat, now + after)
            self.next_sweep = max(self.next_sweep, now + after)
            return
        self._postponed = False
        if self._interval() == self.settings.IDLE_INTERVAL:
            heartbeat = sweep = True  # idle: both in the one wake-up, never two a minute
        # Heartbeat first: after an outage longer than a lease, the sweep must not find
        # this process's own live runs expired. (No savepoints inside the tick's block.)
        if heartbeat:
            with transaction.atomic(using=self.using, savepoint=False):
                self.heartbeat(process, now)
        if sweep:
            with transaction.atomic(using=self.using, savepoint=False):
                self.sweep(now)

    def _release_soon(self) -> timedelta | None:
        """If runs held here are released within ``release_guard``: how long until just
        after that; else None."""
        release = self.pool.next_release() if self.pool else None
        if release is None:
            return None
        until = release - time.monotonic()
        if until >= self.release_guard.total_seconds():
            return None
        return timedelta(seconds=max(until, 0.0)) + AFTER_RELEASE

    def attend(self, now: datetime, ahead: records.Horizon) -> attention.Evaluation | None:
        """Flag the runs late for their deadline (deadlines.py: one statement when none
        is), then judge which schedules need attention, once an ``ALERT_INTERVAL``, and
        when a run's deadline passed since the last time (``deadline_passed``); in the
        tick's transaction (an idle wake-up stays one transaction).

        Any error is logged and waits for the next evaluation: alerts must never stop the
        scheduling (a database gone away fails the tick's next statement anyway)."""
        if now < self.next_attention and not self.deadline_passed(now, ahead):
            return None
        self.next_attention = now + self.settings.ALERT_INTERVAL
        self._attended_at = now
        try:
            # A savepoint in the tick's transaction: an error here undoes this alone, never
            # the heartbeat and sweep before it. Late runs first: attention judges them.
            with transaction.atomic(using=self.using):
                deadlines.flag_late(now, self.using)
                found = attention.evaluate(now, self.using)
        except Exception:
            logger.exception("Could not judge which schedules need attention.")
            return None
        self._alerts_watched = bool(found.watched)
        return found

    def deadline_passed(self, now: datetime, ahead: records.Horizon) -> bool:
        """Whether a run's deadline passed since the last look for late runs, and that look
        was at least ``ALERT_INTERVAL_FLOOR`` ago (a burst of deadlines is one look).
        A deadline already behind the last look waits for the next ``ALERT_INTERVAL``:
        that look failed, or the run was recorded late already."""
        deadline = ahead.next_deadline
        if deadline is None or not self._attended_at <= deadline < now:
            return False
        return now >= self._attended_at + ALERT_INTERVAL_FLOOR

    def deadline_wake(self, now: datetime, ahead: records.Horizon) -> datetime | None:
        """When a planning process next looks for late runs before its ``ALERT_INTERVAL``:
        just after the earliest deadline of a run (None if no run has one: no wake-up), no
        sooner than ``ALERT_INTERVAL_FLOOR`` after the last look. A deadline behind this
        tick's look was flagged by it (the horizon was read before): a tick a floor later
        reads the next one. Behind an earlier look, it waits (``deadline_passed``)."""
        deadline = ahead.next_deadline
        if deadline is None:
            return None
        floor = self._attended_at + ALERT_INTERVAL_FLOOR
        if deadline < self._attended_at:
            return floor if self._attended_at == now else None
        return max(deadline + LATE_AFTER, floor)

    def probing(self) -> bool:
        """Whether this tick's look ahead also looks for leases of dead holders: at most once
        a ``PROBE_INTERVAL`` (it reads pg_locks, and a busy loop ticks far more often),
        and only while this process may judge (presence.py)."""
        if not self.listener.may_judge() or time.monotonic() < self._next_probe:
            return False
        self._next_probe = time.monotonic() + presence.PROBE_INTERVAL.total_seconds()
        return True

    def holding(self) -> bool:
        """Whether this process holds leases: runs in its pool or outcomes to record."""
        return bool(self.pool and not self.pool.idle()) or bool(self.recorder.holding())

    def hold_leases(self, claimed_at: datetime) -> datetime | None:
        """Holding leases now: heartbeat and sweep at the busy pace from the claim on.

        Returns the heartbeat's time if this brought it forward: a sleep must end by then.
        """
        soon = claimed_at + self.settings.HEARTBEAT_INTERVAL
        brought_forward = soon < self.next_heartbeat
        if brought_forward:
            self.next_heartbeat = soon
        self.next_sweep = min(self.next_sweep, claimed_at + self.settings.SWEEP_INTERVAL)
        return soon if brought_forward else None

    def heartbeat(self, process: SchedulerProcess | None, now: datetime) -> None:
        """Heartbeat; often while holding leases, once an idle interval while holding none
        (``SchedulerProcess.stale_after()`` allows for the longer of the two).

        Only the leases of runs still held here are extended: the pool's, then those whose
        outcomes the recorder has yet to record (a run leaving the pool is put to the
        recorder first, so read in this order it is in one or the other). A run held no
        more, its outcome not recorded, keeps its lease until the sweeper settles it.
        """
        assert process is not None
        held = {claim.token for claim in self.pool.in_flight()} if self.pool else set()
        held |= self.recorder.holding()
        leases.heartbeat(process, now, held, self.using)
        # Holding leases, if only for outcomes still to record: the busy pace.
        interval = self.settings.HEARTBEAT_INTERVAL if held else self._interval()
        self.next_heartbeat = now + interval

    def sweep(self, now: datetime) -> leases.SweepResult:
        swept = leases.sweep(now, self.using, orphans=self.listener.may_judge())
        if swept.reentered or swept.failed:
            logger.warning(
                "Expired leases: %d runs re-entered, %d failed.", swept.reentered, swept.failed
            )
        fleet.skip_undeployed(now, self.using)
        overlap.promote_queued(self.using, None)
        claims.skip_late(now, self.using)
        SchedulerProcess.objects.using(self.using).stale(now).forgettable().delete()
        holding = self.pool is not None and not self.pool.idle()
        self.next_sweep = now + (self.settings.SWEEP_INTERVAL if holding else self._interval())
        return swept

    def wake_times(self, now: datetime, ahead: records.Horizon) -> list[datetime | None]:
        """When housekeeping is next due: sweep, heartbeat, lease expiry, and while a lease
        is held anywhere, the probe for dead holders (presence.py)."""
        times = [self.next_sweep, self.next_heartbeat, ahead.next_expiry]
        if self._alerts_watched:
            times.append(self.next_attention)
        if ahead.next_expiry is not None and self.listener.may_judge():
            times.append(now + presence.PROBE_INTERVAL)
        return times

    def _interval(self) -> timedelta:
        """Between heartbeats and sweeps: short while holding leases, long when idle."""
        holding = self.pool is not None and not self.pool.idle()
        return self.settings.HEARTBEAT_INTERVAL if holding else self.settings.IDLE_INTERVAL
