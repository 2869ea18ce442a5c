"""Claims waiting for a time: the holder hands on those claimed ahead of their plan time
when it comes, and the deadlines find those still waiting past their start deadline."""

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django_periodic.engine.records import Claim

# Start deadlines of claims no longer waiting kept, beyond twice the claims in flight.
STALE_DEADLINES = 1000


class Holder:
    """Claims made ahead of their plan time, each handed on (``release``) when it comes.

    One thread waits for the earliest; a run therefore starts on time to the millisecond,
    however many were claimed for the same moment. ``lead()`` seconds before that (about a
    start mark's round trip), the claims coming then are handed to ``prepare`` first: so
    the first of a burst's start marks are written by the time it is released, not after
    (starts.py).
    """

    def __init__(
        self,
        release: Callable[[list[Claim]], None],
        prepare: Callable[[list[Claim]], None] = lambda claims: None,
        lead: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._release = release
        self._prepare = prepare
        self._lead = lead
        self._heap: list[tuple[float, int, Claim]] = []  # to release, by time
        self._unprepared: list[tuple[float, int, Claim]] = []  # to prepare, by time
        self._order = itertools.count()  # ties in time keep the claim order
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="periodic-holder", daemon=True)
        self._thread.start()

    def hold(self, claim: Claim, starts_at: float) -> None:
        with self._changed:
            entry = (starts_at, next(self._order), claim)
            heapq.heappush(self._heap, entry)
            heapq.heappush(self._unprepared, entry)
            if self._unprepared[0][2] is claim:
                self._changed.notify()

    def next_release(self) -> float | None:
        """When the earliest claim held is released (time.monotonic()); None: none held."""
        with self._changed:
            return self._heap[0][0] if self._heap else None

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while not self._stopped:
                lead = self._lead()
                now = time.monotonic()
                if self._unprepared and self._unprepared[0][0] - lead <= now:
                    coming = _pop_until(self._unprepared, now + lead)
                    self._changed.release()  # it takes the pool's lock: hold() must not wait for it
                    try:
                        self._prepare(coming)
                    finally:
                        self._changed.acquire()
                elif self._heap and self._heap[0][0] <= now:
                    self._release(_pop_until(self._heap, now))
                else:
                    self._changed.wait(self._wait(lead, now))

    def _wait(self, lead: float, now: float) -> float | None:
        """Seconds until the next claim to prepare or release (None: none held)."""
        times = [self._unprepared[0][0] - lead] if self._unprepared else []
        times += [self._heap[0][0]] if self._heap else []
        return min(times) - now if times else None


def _pop_until(heap: list[tuple[float, int, Claim]], until: float) -> list[Claim]:
    """Take out of ``heap`` the claims whose time is ``until`` or before, earliest first."""
    popped = []
    while heap and heap[0][0] <= until:
        popped.append(heapq.heappop(heap)[2])
    return popped


class Deadlines:
    """The start deadlines of a pool's claims (first starts), earliest first: the loop finds
    those past theirs without walking every claim in flight.

    Entries stay when a job starts or a claim leaves: they are dropped when they come
    first, and all at once when they outnumber the claims in flight.
    """

    def __init__(self, waiting: Callable[[Claim], bool], in_flight: Callable[[], int]) -> None:
        self._waiting = waiting  # whether a claim is in flight and not started
        self._in_flight = in_flight  # how many claims are in flight
        self._heap: list[tuple[datetime, int, Claim]] = []
        self._order = itertools.count()

    def add(self, claim: Claim) -> None:
        deadline = claim.values.start_deadline
        if claim.values.attempt == 1 and deadline is not None:
            heapq.heappush(self._heap, (deadline, next(self._order), claim))

    def earliest(self) -> datetime | None:
        """The earliest deadline of a claim still waiting."""
        self._drop_done()
        return self._heap[0][0] if self._heap else None

    def pop_passed(self, monotonic: float) -> list[Claim]:
        """Take out the claims still waiting whose deadline passed by ``monotonic``."""
        late = []
        while self.earliest() is not None:
            claim = self._heap[0][2]
            if not claim.too_late(claim.db_time(monotonic)):
                break
            late.append(heapq.heappop(self._heap)[2])
        return late

    def _drop_done(self) -> None:
        heap = self._heap
        if len(heap) > 2 * self._in_flight() + STALE_DEADLINES:
            heap[:] = [entry for entry in heap if self._waiting(entry[2])]
            heapq.heapify(heap)
        while heap and not self._waiting(heap[0][2]):
            heapq.heappop(heap)
