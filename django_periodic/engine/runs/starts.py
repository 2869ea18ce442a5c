"""Marking runs started, durably, before their jobs are called, never far ahead of them.

After a crash the sweeper must tell a run whose job never started (claimed ahead of its
plan time, or waiting for a thread) from one whose job was running: the first is run
again whatever its schedule's reentry policy, since nothing of it ran; the second follows
that policy. So a run's lease is marked started, and that commits, before its job is
called (``Lease.started_at``).

A mark written long before the call would be a lie after a crash: a run still waiting
for a thread would be failed ``lease_expired`` although its job never ran. So a run is
marked a few milliseconds before its call at most: with short jobs, no more runs wait
marked for a thread than the threads call in that time (``limit``, workers.py:
``MARK_AHEAD_TIME``); with long jobs, none: a run is marked when a thread takes it. A
thread calls its job as soon as it has its marked claim.

The marks are written on a thread of their own, in the order the threads take the claims,
one statement for those that start together: while the threads call the jobs already
marked, the next ones are being marked, so a burst of short jobs waits for no round trip
but the first. That one is written ahead too: the holder hands the claims held for a plan
time over about a round trip before it (holding.py).

An atomic job's run is not marked (``_needs_no_mark``): after a crash it runs again
whether its job started or not, since nothing of it stays unless its outcome commits.
"""

import itertools
import logging
import threading
import time
from collections.abc import Callable
from uuid import UUID

from django.db import connections

from django_periodic import registry
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import leases

logger = logging.getLogger("django_periodic")

# Weight of the latest statement in the running average of a mark's round trip.
ROUND_TRIP_WEIGHT = 0.2


class StartMarks:
    """Marks a pool's claims started, ahead of its threads by at most ``limit(round_trip)``
    claims, given a mark's average round trip in seconds.

    ``expect()`` gives the claims in the order the threads will take them; ``mark()``
    waits, on a thread that took one, until its mark is written. The next statement is
    written once half the marks ahead are taken, or at once when a thread waits: so a
    statement marks about half the limit, and the threads rarely wait.
    """

    def __init__(self, limit: Callable[[float], int]) -> None:
        self.limit = limit
        self.round_trip = 0.0  # seconds a mark takes, on average (0: none written yet)
        lock = threading.Lock()
        self._to_mark = threading.Condition(lock)  # the marking thread waits on it
        self._marked_now = threading.Condition(lock)  # threads waiting for a mark do
        self._expected: dict[Claim, None] = {}  # to mark, in the order threads take them
        self._writing: set[Claim] = set()  # in the statement being written
        self._marked: dict[Claim, bool] = {}  # written, not taken yet: whether it held
        self._wanted: set[Claim] = set()  # taken by a thread that waits for its mark
        self._refill_at = 0  # marks left ahead when the next statement is due
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="periodic-marks", daemon=True)
        self._thread.start()

    def expect(self, claims: list[Claim]) -> None:
        """Claims threads will take, in that order (those already expected are left)."""
        with self._to_mark:
            for claim in claims:
                if not _needs_no_mark(claim) and not self._knows(claim):
                    self._expected[claim] = None
            if self._wanted or self._run_down():
                # Only then is a statement due (_next_batch): waking the marking thread
                # for nothing costs every claim a thread switch.
                self._to_mark.notify()

    def mark(self, claim: Claim) -> bool:
        """Wait until ``claim``'s lease is marked started; False if it was lost (or the
        mark could not be written): its job must not start."""
        if _needs_no_mark(claim):
            return True
        with self._to_mark:
            if claim not in self._marked:
                self._wanted.add(claim)
                if not self._knows(claim):
                    self._expected[claim] = None
                self._to_mark.notify()
                while claim not in self._marked and not self._stopped:
                    self._marked_now.wait()
                self._wanted.discard(claim)
            if self._expected and self._run_down():
                self._to_mark.notify()  # enough places ahead are free for a statement
            return self._marked.pop(claim, False)

    def forget(self, claims: list[Claim]) -> None:
        """Drop claims that no thread will take (withdrawn): they hold no place ahead."""
        with self._to_mark:
            for claim in claims:
                self._expected.pop(claim, None)
                self._marked.pop(claim, None)
                self._writing.discard(claim)
            self._to_mark.notify()

    def stop(self) -> None:
        """End the marking thread; a thread still waiting for a mark gets False."""
        with self._to_mark:
            self._stopped = True
            self._to_mark.notify()
            self._marked_now.notify_all()

    def _run_down(self) -> bool:
        """Whether the marks ahead have run down to the refill point: a statement is due
        (call with the lock held)."""
        return len(self._marked) <= self._refill_at

    def _knows(self, claim: Claim) -> bool:
        return claim in self._expected or claim in self._writing or claim in self._marked

    def _run(self) -> None:
        try:
            self._mark_until_stopped()
        finally:
            self.stop()  # whatever ended it: no thread may wait for a mark forever
            connections.close_all()  # this thread's own

    def _mark_until_stopped(self) -> None:
        with self._to_mark:
            while not self._stopped:
                batch = self._next_batch()
                if not batch:
                    self._to_mark.wait()
                    continue
                self._writing = set(batch)
                self._to_mark.release()  # a database write: the threads go on meanwhile
                try:
                    marked = self._write(batch)
                finally:
                    self._to_mark.acquire()
                for claim in batch:
                    if claim in self._writing:  # not forgotten meanwhile
                        self._marked[claim] = claim.token in marked
                self._writing = set()
                self._marked_now.notify_all()

    def _next_batch(self) -> list[Claim]:
        """The claims to mark now (call with the lock held): those threads wait for, and
        as many more as fit ahead, once half the marks ahead are taken or a thread waits."""
        if not self._expected:
            return []
        wanted = [claim for claim in self._wanted if claim in self._expected]
        limit = max(self.limit(self.round_trip), 0)
        self._refill_at = limit - (limit + 1) // 2
        room = limit - len(self._marked) - len(wanted)
        if not wanted and not self._run_down():
            return []
        for claim in wanted:
            del self._expected[claim]
        ahead = list(itertools.islice(self._expected, max(room, 0)))
        for claim in ahead:
            del self._expected[claim]
        return wanted + ahead

    def _write(self, batch: list[Claim]) -> set[UUID]:
        """The tokens of ``batch`` marked; none if the database could not be reached (their
        threads give the runs back unstarted)."""
        started = time.monotonic()
        by_database: dict[str, list[UUID]] = {}
        for claim in batch:
            by_database.setdefault(claim.using, []).append(claim.token)
        marked: set[UUID] = set()
        for using, tokens in by_database.items():
            try:
                marked |= leases.mark_started(tokens, using)
            except Exception:
                logger.exception("Could not mark %d runs started; giving them back.", len(tokens))
                connections[using].close()  # reconnects for the next statement
        took = time.monotonic() - started
        self.round_trip += ROUND_TRIP_WEIGHT * (took - self.round_trip) if self.round_trip else took
        return marked


def _needs_no_mark(claim: Claim) -> bool:
    """An atomic job's run is not marked: nothing of it stays unless its outcome commits,
    so after a crash it is run again whether its job started or not
    (``retries.may_run_again``), and its claim, its transaction and nothing else is what
    it costs."""
    return registry.is_atomic(claim.values.job_name)
