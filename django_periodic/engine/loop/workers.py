"""Executing claimed runs off the loop: the worker threads that call the jobs, the claims
waiting for one, and those held for their plan time; the outcomes go to the recorder. The
claims for the threads that free up are made on a thread of their own (``Claimer``)."""

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime

from django.db import connections

from django_periodic.engine.loop import eventloop, executor, guarding, worker_connections
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.holding import Deadlines, Holder
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.stop_signals import StopSignals
from django_periodic.engine.records import AttemptOutcome, Claim
from django_periodic.engine.runs.outcomes import unstarted
from django_periodic.engine.runs.starts import StartMarks

logger = logging.getLogger("django_periodic")

# Claims are taken ahead of the threads (the prefetch) only while jobs are this short on
# average: a run claimed ahead then waits milliseconds, never behind a long job.
SHORT_JOB = 0.05
# At most this many runs held for their plan time (claimed ahead of it) while jobs are
# short or not yet timed; with long jobs, only as many as the threads take.
MAX_HELD = 1000
# At most this many async runs awaited at once on the event loop: beyond, no more claims
# (one process must not take every I/O-bound run of a fleet).
MAX_AWAITING = 100
# Weight of the latest job in the running average of durations.
DURATION_WEIGHT = 0.1
# Runs are marked started at most about this many seconds of the threads' work ahead of
# their call (starts.py), and at most this many runs, however short the jobs.
MARK_AHEAD_TIME = 0.02
MARK_AHEAD_LIMIT = 1000
# Held claims are marked started this many marks' round trips before their release, and
# at most this many seconds before (a slow database must not stretch the time between a
# run's mark and its job's call).
MARK_LEAD = 1.5
MAX_MARK_LEAD = 0.05


class WorkerPool:
    """Threads that execute claimed runs, the claims waiting for one (the prefetch), and
    those held for their plan time (claimed ahead of it).

    ``on_done`` is called each time a claim leaves the pool (its job returned), on the
    worker's thread (the event loop's, for an async job); the outcome goes to the recorder.
    ``on_handoff`` is called when a thread hands an async job to the event loop, and so is
    free again. Up to ``prefetch`` claims may wait for a thread, while the jobs are short
    (``SHORT_JOB``).
    """

    def __init__(
        self,
        size: int,
        on_done: Callable[[], None],
        recorder: Recorder,
        prefetch: int = 0,
        on_handoff: Callable[[], None] = lambda: None,
    ) -> None:
        self.size = size
        self.prefetch = prefetch
        # Unknown at first: as long as a slow job, so that there is no prefetch (claims
        # ahead of the plan time take "unknown" as short, see room_ahead()).
        self._average_duration = float("inf")
        # The jobs' typical duration, a running geometric mean: how far ahead runs may be
        # marked started. One job held up by a collection must not make a burst of short
        # ones look slow, as it does the average for a while.
        self._log_duration = math.inf
        self._on_done = on_done
        self._on_handoff = on_handoff
        self._recorder = recorder
        self._queue: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._in_flight: dict[Claim, StopRequest] = {}
        self._held: set[Claim] = set()  # in flight, waiting for their plan time
        self._started: dict[Claim, float] = {}  # in flight, taken by a thread: since when
        self._awaiting: set[Claim] = set()  # started async runs on the event loop: no thread
        self._abandoned: set[Claim] = set()
        # The loop looks at these each tick; kept as it goes, so that a tick costs nothing
        # per claim in flight (a burst holds a thousand):
        self._timed: dict[Claim, StopRequest] = {}  # in flight, their schedule has a timeout
        self._deadlines = Deadlines(self._waiting, lambda: len(self._in_flight))
        self._start_marks = StartMarks(self._marks_ahead)
        self._threads = 0
        for _ in range(size):
            self._start_thread()
        self._holder = Holder(self._release, self._mark_coming, self._mark_lead)

    def _start_thread(self) -> None:
        self._threads += 1
        name = f"periodic-worker-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    @property
    def capacity(self) -> int:
        """Threads, plus the prefetch while jobs are short."""
        short = self._average_duration < SHORT_JOB
        return self.size + (self.prefetch if short else 0)

    def next_release(self) -> float | None:
        """When the earliest run held for its plan time is released (time.monotonic())."""
        return self._holder.next_release()

    def free(self) -> int:
        """How many more runs due now the pool takes: idle threads plus room in the prefetch
        (async runs awaited on the event loop hold no thread, up to ``MAX_AWAITING``)."""
        with self._lock:
            waiting_or_busy = len(self._in_flight) - len(self._held) - len(self._awaiting)
            room = min(self.capacity - waiting_or_busy, MAX_AWAITING - len(self._awaiting))
            return max(room, 0)

    def room_ahead(self) -> int:
        """How many more runs the pool holds for their plan time: many while jobs are short
        (or not timed yet), else as many as there are threads and prefetch free."""
        with self._lock:
            if self._short_so_far():
                return max(MAX_HELD - len(self._held), 0)
            return max(self.capacity - len(self._in_flight), 0)

    def _short_so_far(self) -> bool:
        """No job is known to be long: short on average (or none finished yet), and none
        running longer than a short one now."""
        if self._average_duration >= SHORT_JOB and self._average_duration != float("inf"):
            return False
        now = time.monotonic()
        return all(now - since < SHORT_JOB for since in self._started.values())

    def starving(self) -> bool:
        """A thread is idle and no claim waits for one: claim now, even a single run."""
        with self._lock:
            busy = len(self._in_flight) - len(self._held) - len(self._awaiting)
            return busy < self.size

    def worth_claiming(self) -> bool:
        """Whether freed capacity is worth a claim now: a thread starves, or half of what
        the pool ever takes is free (``free()``: at most ``MAX_AWAITING``, however large the
        prefetch). Under load, claims are batched so (and the loop woken for them only)."""
        return self.starving() or self.free() * 2 >= min(self.capacity, MAX_AWAITING)

    def submit(self, *claims: Claim) -> None:
        """Execute claims: at once, or at their plan time if claimed ahead of it. A claim's
        runs come in together: one lock, and one hand-off to the start marks."""
        starts_at = {claim: claim.starts_at() for claim in claims}
        with self._lock:
            now = time.monotonic()
            for claim in claims:
                stop = self._in_flight[claim] = StopRequest()
                if claim.values.timeout is not None:
                    self._timed[claim] = stop
                self._deadlines.add(claim)
            held = [claim for claim in claims if starts_at[claim] > now]
            self._held.update(held)
            if len(held) < len(claims):
                self._enqueue([claim for claim in claims if starts_at[claim] <= now])
        for claim in held:
            self._holder.hold(claim, starts_at[claim])

    def _mark_lead(self) -> float:
        """How long before their release held claims are marked started: about a mark's
        round trip, so that the marks are written as the claims come due."""
        return min(MARK_LEAD * self._start_marks.round_trip, MAX_MARK_LEAD)

    def _marks_ahead(self, round_trip: float) -> int:
        """How many claims may wait for a thread marked started (starts.py): with short
        jobs, a threads' worth and as many as the threads call within ``MARK_AHEAD_TIME``
        (or a mark's ``round_trip``, if longer) at the jobs' typical duration; with long
        ones, or before any is timed, none: a run is marked when a thread takes it (a round
        trip is little beside a long job)."""
        typical = math.exp(self._log_duration)
        if typical >= SHORT_JOB:
            return 0
        soon = int(self.size * max(round_trip, MARK_AHEAD_TIME) / max(typical, 1e-6))
        return self.size + min(soon, MARK_AHEAD_LIMIT)

    def _mark_coming(self, claims: list[Claim]) -> None:
        """The held claims about to be released are the next the threads take: the first
        of them are marked started by the time they are (starts.py)."""
        with self._lock:
            held = [claim for claim in claims if claim in self._held]
        self._start_marks.expect(held)

    def _release(self, claims: list[Claim]) -> None:
        with self._lock:
            self._held.difference_update(claims)
            self._enqueue(claims)

    def _enqueue(self, claims: list[Claim]) -> None:
        """Hand claims to the threads (call with the lock held: their start marks follow
        the queue's order)."""
        for claim in claims:
            self._queue.put(claim)
        self._start_marks.expect(claims)

    def in_flight(self) -> dict[Claim, StopRequest]:
        with self._lock:
            return dict(self._in_flight)

    def holds(self, claim: Claim) -> bool:
        with self._lock:
            return claim in self._in_flight

    def timed(self) -> dict[Claim, StopRequest]:
        """The claims in flight whose schedule has a timeout: the only ones with a time to
        watch."""
        with self._lock:
            return dict(self._timed)

    def of_runs(self, run_ids: set[int]) -> dict[Claim, StopRequest]:
        """The claims in flight of these runs."""
        if not run_ids:
            return {}
        with self._lock:
            return {c: stop for c, stop in self._in_flight.items() if c.values.pk in run_ids}

    def withdraw_late(self) -> list[Claim]:
        """Take back the claims still waiting for a thread past their start deadline: they
        are skipped at once rather than when a thread frees up."""
        with self._lock:
            late = self._deadlines.pop_passed(time.monotonic())
            for claim in late:
                self._forget(claim)
        self._start_marks.forget(late)
        return late

    def next_start_deadline(self) -> datetime | None:
        """The earliest start deadline of the claims waiting for a thread (first starts)."""
        with self._lock:
            return self._deadlines.earliest()

    def withdraw_unstarted(self) -> list[Claim]:
        """Take back every claim whose job has not started (held for its plan time, or
        waiting for a thread): none of them will start here."""
        with self._lock:
            unstarted = [claim for claim in self._in_flight if self._waiting(claim)]
            for claim in unstarted:
                self._forget(claim).set(StopRequest.SHUTDOWN)
            self._lock.notify_all()
        self._start_marks.forget(unstarted)
        return unstarted

    def _waiting(self, claim: Claim) -> bool:
        """Whether the claim is in flight and no thread has started its job (call with the
        lock held)."""
        return claim in self._in_flight and claim not in self._started

    def _forget(self, claim: Claim) -> StopRequest:
        """Take a claim out of the pool (call with the lock held); its stop request."""
        self._held.discard(claim)
        self._timed.pop(claim, None)
        return self._in_flight.pop(claim)

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

    def stop_all(self, reason: str) -> None:
        with self._lock:
            for stop in self._in_flight.values():
                stop.set(reason)

    def abandon(self, claim: Claim) -> None:
        """Stop counting a run whose job overran: a new thread takes its place.

        Python cannot kill a thread; the old one ends when its job returns, and its
        late outcome is refused by the lease's token.
        """
        with self._lock:
            if claim not in self._in_flight:
                return
            self._forget(claim)
            self._abandoned.add(claim)
            self._lock.notify_all()
            self._start_thread()

    def stop(self) -> None:
        """Let each idle thread exit; a thread still running a job exits after it, and the
        event loop after the async jobs it awaits."""
        self._holder.stop()
        self._start_marks.stop()
        for _ in range(self.size):
            self._queue.put(None)
        eventloop.stop()

    def _note_duration(self, seconds: float) -> None:
        log_duration = math.log(max(seconds, 1e-6))
        if self._average_duration == float("inf"):
            self._average_duration, self._log_duration = seconds, log_duration
        else:
            weight = DURATION_WEIGHT
            self._average_duration += weight * (seconds - self._average_duration)
            self._log_duration += weight * (log_duration - self._log_duration)

    def _work(self) -> None:
        while (claim := self._queue.get()) is not None:
            self._execute(claim)
            with self._lock:
                if claim in self._abandoned:
                    self._abandoned.discard(claim)
                    break  # its replacement already serves the queue
        connections.close_all()  # this thread's own connections

    def _execute(self, claim: Claim) -> None:
        with self._lock:
            stop = self._in_flight.get(claim)
            started = time.monotonic()
            if stop is not None and stop.reason != StopRequest.SHUTDOWN:
                self._started[claim] = started
            else:
                stop = None  # given up at shutdown before a thread took it
        outcome = None
        try:
            if stop is not None:
                # The thread's connection serves run after run (whatever CONN_MAX_AGE
                # says), unless the last job left it unfit for the next.
                worker_connections.prepare_for_run()
                if not self._start_marks.mark(claim):
                    outcome = unstarted(claim)  # refused by its token if the lease was lost
                    stop = None
                started = self._calling(claim)
            if stop is not None:
                called = executor.call_job(claim, stop)
                if isinstance(called, executor.AsyncRun):
                    self._await(claim, called, started)
                    return  # this thread is free; the run stays in flight until it ends
                outcome = called
        except BaseException:
            # Never lose the thread. The run keeps its lease until it expires; the
            # sweeper then settles it.
            logger.exception("Could not execute run %s.", claim.values.pk)
        self._leave(claim, outcome, started)

    def _calling(self, claim: Claim) -> float:
        """The job is called now: its time runs from here, not from the wait for its mark
        (a slow mark must not make short jobs look long, and stop the claims ahead)."""
        now = time.monotonic()
        with self._lock:
            if claim in self._started:
                self._started[claim] = now
        return now

    def _await(self, claim: Claim, run: executor.AsyncRun, started: float) -> None:
        """Hand an async run to the event loop; it leaves the pool when its coroutine ends."""

        def ended(future: Future[AttemptOutcome | None]) -> None:  # on the event loop's thread
            with self._lock:
                self._awaiting.discard(claim)
                if claim in self._abandoned:
                    # Its timeout gave it a replacement thread, but it held none: retire one.
                    self._abandoned.discard(claim)
                    self._queue.put(None)
            self._leave(claim, run.ended(future), started)

        with self._lock:
            self._awaiting.add(claim)
        eventloop.submit(run.outcome()).add_done_callback(ended)
        self._on_handoff()  # its thread is free for another run

    def _leave(self, claim: Claim, outcome: AttemptOutcome | None, started: float) -> None:
        """A run leaves the pool (from any thread): its outcome goes to the recorder first,
        so that it is always held by one or the other until recorded (``Recorder.holding``)."""
        if outcome is not None and not outcome.recorded:
            self._recorder.put(outcome)
        with self._lock:
            if claim in self._in_flight:
                self._forget(claim)
            self._started.pop(claim, None)
            self._note_duration(time.monotonic() - started)
            self._lock.notify_all()
        self._on_done()


class Claimer:
    """Claims for the capacity jobs free, on a thread of its own: the loop thread plans and
    keeps house meanwhile, and a claim is on its way while the threads still have runs
    queued.

    The loop claims too, once a tick (what planning made due); this thread claims between
    ticks. Woken (``wake()``), it calls ``claim_free``, and again while ``worth_claiming()``
    and the last claim took all it asked for (``claim_free`` says whether it did): a claim
    that came back short means nothing more is due, until the next wake-up. An error is
    logged and backed off as the loop's are (``guarding.Guard``).
    """

    def __init__(
        self,
        claim_free: Callable[[], bool],
        worth_claiming: Callable[[], bool],
        stop: StopSignals,
    ) -> None:
        self._claim_free = claim_free
        self._worth_claiming = worth_claiming
        self._changed = threading.Condition()
        self._woken = False
        self._stopped = False
        self._took_all = False
        self._guarded = guarding.Guard(stop, sleep=self._back_off)
        self._thread = threading.Thread(target=self._run, name="periodic-claims", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Claim for the pool's free capacity soon (from any thread)."""
        with self._changed:
            self._woken = True
            self._changed.notify()

    def stop(self) -> None:
        """End the thread, after the claim it may be making (its runs are in the pool)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            while self._next_wake():
                while not self._stopped and self._worth_claiming():
                    if not self._guarded(self._claim) or not self._took_all:
                        break
        finally:
            connections.close_all()  # this thread's own

    def _next_wake(self) -> bool:
        """Wait until woken; False once stopped."""
        with self._changed:
            self._changed.wait_for(lambda: self._woken or self._stopped)
            self._woken = False
            return not self._stopped

    def _claim(self) -> None:
        self._took_all = self._claim_free()

    def _back_off(self, seconds: float) -> None:
        """Wait after a failed claim (unless stopped), then try again."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopped, seconds)
            self._woken = True
