"""The scheduler loop: plan, sweep, heartbeat, claim, then sleep until there is work.

Before it works or sleeps, the loop reads what comes next in one query (``look_ahead``):
an idle scheduler reads this and goes back to sleep; nothing is planned, claimed or swept
unless the horizon says something is due, so idling costs one transaction per wake-up (with
the heartbeat, the sweep and the judging of alerts when they are due).

Decisions live in planner.py and leases.py, the heartbeat, sweep and probe for dead
holders in housekeeping.py, the watch over runs in flight in watching.py, the stop in
shutdown.py; this module only orders them in time, owns the worker threads and the
wake-ups, and survives a database that goes away, and any other error of a step: logged,
backed off, carried on (guarding.py). A bad row fails alone where it is handled (planning,
claiming, hand-off, watching); an error that still reaches the loop is a bug, and must not
stop the process either.
"""

import gc
import logging
import math
import os
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from django_periodic.choices import LEDGER_FORMAT
from django_periodic.conf import get_settings
from django_periodic.db import CONNECTION_ERRORS, announcements, clock, pooling
from django_periodic.engine import fleet, records, tracing
from django_periodic.engine.backends import ledger
from django_periodic.engine.loop import guarding, housekeeping, wakeups, watching
from django_periodic.engine.loop import workers as workers_
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.shutdown import shut_down
from django_periodic.engine.loop.stop_signals import StopSignals
from django_periodic.engine.planning import after, code_schedules, planner
from django_periodic.engine.runs import admission, claims, handoff, presence
from django_periodic.models import Run, SchedulerProcess

logger = logging.getLogger("django_periodic")


def look_ahead(using: str = "default", *, judge: bool = False) -> records.Horizon:
    """The horizon now: one statement on PostgreSQL, a few through the ORM elsewhere.

    With ``judge``, it also tells whether a lease is held by a process that died
    (``presence.py``): only a process that may judge asks. Runs our workers execute count
    only if this process has their job (``fleet.local_jobs``).
    """
    return ledger(using).look_ahead(fleet.local_jobs(), judge)


# Runs claimed ahead per statement: small enough that other processes, woken by the
# planner's NOTIFY, claim their share of a burst at the same time.
AHEAD_BATCH = 100
# How often, within the lead, a schedule whose previous run is still in flight is looked
# at again to be planned ahead (else it is planned when due).
REPLANS = 4


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
        # Each step of the loop: an error is logged and backed off, never the process's end.
        self._guarded = guarding.Guard(self.stop)
        self.recorder = Recorder()
        self.pool = (
            workers_.WorkerPool(
                workers,
                self._capacity_freed,
                self.recorder,
                prefetch=self.settings.PREFETCH,
                on_handoff=self._capacity_freed,
            )
            if workers
            else None
        )
        # Claims for the capacity jobs free between ticks are made on a thread of their
        # own; the loop's (after planning) and its take turns.
        self._claiming = threading.Lock()
        self.claimer = (
            workers_.Claimer(self._claim_freed_capacity, self._worth_claiming, self.stop)
            if workers
            else None
        )
        self.listener = wakeups.Listener(using, self._alarm)
        self.housekeeper = housekeeping.Housekeeper(
            using=using,
            settings=self.settings,
            pool=self.pool,
            recorder=self.recorder,
            listener=self.listener,
        )
        self.watcher = watching.Watcher(
            using=using, settings=self.settings, pool=self.pool, listener=self.listener
        )
        self._clock_read_at = 0.0  # time.monotonic() when the last tick read the clock
        self._wake_at_monotonic = 0.0  # when the current sleep ends
        # ...or earlier, when a claim between ticks brought the heartbeat forward.
        self._held_wake = math.inf
        # Fires up to this time were planned (or left for when they are due) by the last
        # planning pass: the next looks again when they are due, or at new fires...
        self._planned_to = datetime.min.replace(tzinfo=UTC)
        # ...or, if it left some because a run was in flight, at this time.
        self._replan_at = datetime.min.replace(tzinfo=UTC)
        # The last claim found no more runs due: freed threads wait for news (a tick).
        self._drained = False
        # Runs after runs (after.py): looked at on news (the first tick, a planning pass, a
        # NOTIFY), and at the time the last pass asked for; never while nothing happens.
        self._after_news = True
        self._after_at: datetime | None = None
        # Concurrency limits (admission.py): held runs looked at on the same news, and while
        # some wait, at admission.POLL; never while none does.
        self._limit_news = True
        self._admit_at: datetime | None = None

    @property
    def lead(self) -> timedelta:
        """How long before their plan time fires are planned and claimed (PLAN_AHEAD)."""
        return self.settings.PLAN_AHEAD

    def run(self, *, once: bool = False) -> None:
        """Boot, loop until stopped (or, with ``once``, until what is due now is done), stop."""
        while not self.stop.requested and not self._guarded(self.boot):
            pass  # the database is unreachable at start: keep trying until stopped
        if self.process is None:
            return
        if not once and not self.listener.start(self._take_lock):
            self._log_no_listener()
        # What boot loaded (Django, the apps, the jobs) lives as long as the process. Out of
        # the collector's sight, a full collection walks only what the loop made since: 4-7
        # ms measured, not the 30-55 ms that stalled a burst of runs whenever one fell in it.
        gc.collect()
        gc.freeze()
        try:
            self._run_once() if once else self._run_forever()
        finally:
            # With the database away, what shutdown cannot record is left to the leases.
            self._guarded(self.shutdown)

    def _log_no_listener(self) -> None:
        if pooling.transaction_pooled(self.using):
            logger.warning(
                "Database %r goes through a pooler in transaction mode and WAKEUP_DATABASE is "
                "not set: no wake-ups (polling every %s), and a killed process's runs wait "
                "for their leases to expire.",
                self.using,
                self.poll,
            )
        else:
            logger.info("No LISTEN/NOTIFY on this database: polling every %s.", self.poll)

    def _take_lock(self, raw_connection: Any) -> bool:
        """Hold this process's session lock on the listener's connection (presence.py)."""
        assert self.process is not None
        return presence.take(raw_connection, self.process)

    @property
    def poll(self) -> timedelta:
        return self.settings.POLL_INTERVAL

    def boot(self) -> None:
        """Recovery, before the first tick and logged: register, sync code schedules, settle
        the runs of processes that died, then plan what came due while nobody was planning."""
        now = clock.now(self.using)
        if self.process is None:  # boot is retried when the database was away
            self.process = SchedulerProcess.objects.using(self.using).create(
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=now,
                heartbeat_at=now,
                jobs=list(fleet.local_jobs()),
                ledger_format=LEDGER_FORMAT,
            )
            logger.info("Scheduler %s starting; recovery first.", self.process)
        code_schedules.sync_code_schedules(self.using)
        swept = self.housekeeper.sweep(now)
        planned = self._plan(now) if self.plan else records.PlanResult()
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
        self.housekeeper.next_heartbeat = now + self.settings.HEARTBEAT_INTERVAL

    def tick(self) -> tuple[datetime, datetime]:
        """Do what the horizon says is due now; return (now, when to wake up next)."""
        holding = self.housekeeper.holding()
        # Idle, a wake-up is this one transaction: the look ahead, housekeeping if due, and
        # judging which schedules need attention if due.
        with transaction.atomic(using=self.using):
            ahead = look_ahead(self.using, judge=self.housekeeper.probing())
            now = ahead.now
            self._clock_read_at = time.monotonic()
            if not holding:
                self.housekeeper.keep_house(self.process, now, ahead)
            if self.plan:
                self.housekeeper.attend(now, ahead)
            # In the same transaction: a wake-up with nothing new stays one.
            fired = self._plan_after(now)
            admitted = self._admit(now)
        if holding:  # in transactions of its own, see there
            self.housekeeper.keep_house(self.process, now, ahead)
        planned = self._plan_when_due(now, ahead)
        if self.pool:
            self.watcher.watch(self.process, now)
            self._claim_due(ahead, planned.fired + admitted)
            self._claim_ahead(ahead, planned.fired)
        self._dispatch(ahead, admitted)
        return now, now if planned.schedules or fired else self._next_wake(now, ahead)

    def _plan_after(self, now: datetime) -> int:
        """Record what downstream schedules' upstreams decided, if there may be news:
        runs of theirs may have been planned or ended. Returns how many runs it recorded."""
        due = self._after_news or (self._after_at is not None and self._after_at <= now)
        if not self.plan or not due:
            return 0
        self._after_news = False
        try:
            # A savepoint: whatever goes wrong here must not undo the tick's heartbeat.
            with transaction.atomic(using=self.using):
                result = after.plan_after(now, self.using)
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.exception("Could not plan the runs of schedules after others; trying again.")
            self._after_at = now + after.POLL
            return 0
        self._after_at = result.next_check
        return result.fired + result.skipped

    def _admit(self, now: datetime) -> int:
        """Admit runs held by their concurrency limits into its free slots, if there may be
        news: a run recorded, a run ended, or the time the last pass asked for. Returns how
        many it admitted."""
        due = self._limit_news or (self._admit_at is not None and self._admit_at <= now)
        if not self.plan or not due:
            return 0
        self._limit_news = False
        try:
            # A savepoint: whatever goes wrong here must not undo the tick's heartbeat.
            result = admission.admit(now, self.using)
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.exception("Could not admit the runs waiting for concurrency limits; retrying.")
            self._admit_at = now + admission.POLL
            return 0
        self._admit_at = result.next_pass(now)
        return result.admitted

    def _dispatch(self, ahead: records.Horizon, admitted: int = 0) -> None:
        """Enqueue the tasks of handed-off runs that may start (planners do this). Runs this
        tick planned are seen by the next, which follows at once; a tick that planned none
        costs no statement here."""
        if not self.plan or self.stop.requested:
            return
        if admitted or ahead.handoff_due(self.settings.TASKS_PICKUP_TIMEOUT):
            handoff.dispatch(self.using)

    def _plan_when_due(self, now: datetime, ahead: records.Horizon) -> records.PlanResult:
        """Plan fires that are due, and those coming within the lead not looked at yet."""
        if not self.plan or not ahead.fire_due(self.lead):
            return records.PlanResult()
        if self._left_a_fire(ahead) and now < self._replan_at and not ahead.fire_due():
            return records.PlanResult()  # left for later: a run was in flight
        planned = self._plan(now)
        self._after_news = True  # a fire planned here or by another planner: an upstream's?
        self._limit_news = True
        self._planned_to = now + self.lead
        # A fire this pass left (a run in flight may end within the lead) is looked at again
        # a few times before it is due; the look-ahead shows whether one was left.
        self._replan_at = now + self.lead / REPLANS
        if planned.fired > (self.pool.free() if self.pool else 0):
            announcements.notify(self.using)  # more than we start at once: others claim too
        return planned

    def _left_a_fire(self, ahead: records.Horizon) -> bool:
        """Whether the next fire is one the last planning pass looked at and left (a run of
        its schedule was in flight)."""
        return ahead.next_fire is not None and ahead.next_fire <= self._planned_to

    def _claim_due(self, ahead: records.Horizon, fired: int) -> None:
        """Claim runs that may start now, as many as the pool takes."""
        if self.stop.requested or not (fired or ahead.claimable()):
            self._drained = True
            return
        self._claim_free()

    def _claim_ahead(self, ahead: records.Horizon, fired: int) -> None:
        """Claim runs due within the lead, in batches, to be started at their plan time."""
        assert self.pool is not None
        if self.stop.requested or not (fired or ahead.claimable_ahead(self.lead)):
            return
        while (room := min(self.pool.room_ahead(), AHEAD_BATCH)) > 0:
            if self._claim(room, ahead=self.lead) < room:
                return

    def _claim_free(self) -> bool:
        """Claim for every free slot; whether the claim took all it asked for. One that
        comes back short means nothing more is due, so freed slots wait for news (a tick)
        instead of asking again."""
        assert self.pool is not None
        with self._claiming:
            asked = self.pool.free()
            self._drained = self._claim(asked) < asked
            return asked > 0 and not self._drained

    def _claim(self, limit: int, ahead: timedelta | None = None) -> int:
        """Claim as many runs as the pool takes, at the database's clock when the claim runs:
        the tick's ``now`` may be planning's time ago, and a run claimed ahead waits from
        the claim's time until its plan time."""
        assert self.pool is not None and self.process is not None
        claimed = claims.claim(self.process, None, limit, self.using, ahead=ahead)
        self.pool.submit(*claimed)
        if claimed:
            self._hold_leases(claimed[0].db_claimed_at)
        return len(claimed)

    def _hold_leases(self, claimed_at: datetime | None) -> None:
        """Holding leases now: heartbeat and sweep at the busy pace from the claim on."""
        if claimed_at is None:
            return
        heartbeat_at = self.housekeeper.hold_leases(claimed_at)
        if heartbeat_at is not None:  # brought forward: the loop's sleep ends by then
            self._held_wake = min(self._held_wake, self._monotonic_at(heartbeat_at, claimed_at))
            self._alarm.set(wakeups.CAPACITY)  # from the claimer's thread: the loop looks

    def _monotonic_at(self, at: datetime, now: datetime) -> float:
        return time.monotonic() + (at - now).total_seconds()

    def _capacity_freed(self) -> None:
        # On the worker's thread. Drained, nothing could be claimed for it; under load, too
        # little is free for a claim yet: no wake-up per job.
        if self.claimer is not None and self._worth_claiming():
            self.claimer.wake()

    def _worth_claiming(self) -> bool:
        """Whether the claimer should claim now: something may be due, and enough of the
        pool is free (batched under load, ``WorkerPool.worth_claiming``)."""
        assert self.pool is not None
        return not self._drained and not self.stop.requested and self.pool.worth_claiming()

    def _claim_freed_capacity(self) -> bool:
        """Between ticks, on the claimer's thread, hand slots that jobs freed to a claim: no
        planning, no clock read. Whether it took all it asked for."""
        if self.stop.requested or self._drained:
            return False
        return self._claim_free()

    def _plan(self, now: datetime) -> records.PlanResult:
        """One planning pass: every batch of due schedules, traced if tracing is on."""
        tracer = tracing.tracer
        if tracer is None:
            return self._plan_batches(now)
        started_ns = time.time_ns()
        total = self._plan_batches(now)
        tracer.planned(started_ns, total)
        return total

    def _plan_batches(self, now: datetime) -> records.PlanResult:
        batch_size = self.settings.PLAN_BATCH_SIZE
        total = records.PlanResult()
        while True:
            result = planner.plan_due(now, using=self.using, batch_size=batch_size, ahead=self.lead)
            total += result
            if result.fired or result.skipped:
                logger.debug("Planned %d runs, skipped %d.", result.fired, result.skipped)
            if result.schedules < batch_size:
                return total

    def _next_wake(self, now: datetime, ahead: records.Horizon) -> datetime:
        """The earliest of: next fire, retry, lease expiry, sweep, heartbeat, timeout and a
        run's deadline; capped by the poll interval (the idle interval while LISTEN wakes
        us), and while a lease is held anywhere, by the probe for dead holders
        (presence.py)."""
        cap = self.settings.IDLE_INTERVAL if self.listener.listening else self.poll
        candidates = [now + cap, *self.housekeeper.wake_times(now, ahead)]
        if self.plan and ahead.next_fire is not None:
            candidates.append(self._lead_time(ahead.next_fire, self._planned_to))
            if self._left_a_fire(ahead):
                candidates.append(self._replan_at)
        if self.plan:
            candidates += [*self._handoff_times(now, ahead), self._after_at, self._admit_at]
            # Read by the look ahead: no statement of its own, none at all without deadlines.
            candidates.append(self.housekeeper.deadline_wake(now, ahead))
        if self.pool:
            candidates += [ahead.next_retry, *self.watcher.wake_times(now)]
            if ahead.next_pending is not None and ahead.next_pending > now:
                candidates.append(self._lead_time(ahead.next_pending, now + self.lead))
        return min(at for at in candidates if at is not None)

    def _handoff_times(self, now: datetime, ahead: records.Horizon) -> list[datetime | None]:
        """When handed-off runs need their tasks: at their plan time or retry, and when a
        task waited past the pickup timeout."""
        times = [ahead.next_retry]
        if ahead.next_handoff is not None and ahead.next_handoff > now:
            times.append(ahead.next_handoff)
        if ahead.next_enqueued is not None:
            times.append(ahead.next_enqueued + self.settings.TASKS_PICKUP_TIMEOUT)
        return times

    def _lead_time(self, due: datetime, looked_to: datetime) -> datetime:
        """When to act on something due at ``due``: the lead before it, or when it is due
        if this process already looked ahead that far (up to ``looked_to``)."""
        return due if due <= looked_to else due - self.lead

    def _run_forever(self) -> None:
        while not self.stop.requested:
            self._guarded(self._tick_and_sleep)

    def _tick_and_sleep(self) -> None:
        # The loop keeps its connection between ticks (reconnecting costs statements);
        # _guarded closes it after a database error.
        if self._alarm.clear().strip(wakeups.CAPACITY):
            self.watcher.news = True
        # Before the tick: a claim that brings the heartbeat forward from here on is seen
        # either by the tick's own wake-up time or by this.
        self._held_wake = math.inf
        now, wake_at = self.tick()
        # The clock was read at the start of the tick: the tick's own time is already spent.
        self._wake_at_monotonic = self._clock_read_at + (wake_at - now).total_seconds()
        while (left := min(self._wake_at_monotonic, self._held_wake) - time.monotonic()) > 0:
            reasons = self._alarm.wait(left)
            if not reasons:
                return  # time is up: a whole tick
            if reasons.strip(wakeups.CAPACITY):
                self.watcher.news = True  # a stop, a NOTIFY: a whole tick
                self._after_news = self._limit_news = True
                return

    def _run_once(self) -> None:
        """Plan what is due now, run it and whatever becomes runnable, and return when idle."""
        while not self.stop.requested:
            self._alarm.clear()
            self.watcher.news = True  # not a busy loop: look at everything each tick
            self._after_news = self._limit_news = True
            now, wake_at = self.tick()
            if not self.pool:
                if wake_at > now:
                    return  # planned all that is due, and enqueued what is handed off
                continue
            if self.pool.idle() and self.recorder.flush() and not self._claimable():
                return
            self._alarm.wait(1.0)

    def _claimable(self) -> bool:
        if self.plan:  # runs held by a limit whose slots the ended runs freed
            admission.admit(clock.now(self.using), self.using)
        runs = Run.objects.using(self.using).executed_here().of_jobs(fleet.local_jobs())
        return runs.claimable(clock.now(self.using)).exists()

    def shutdown(self) -> None:
        """Let running jobs finish within the grace, release what is left, unregister."""
        shut_down(self)
