"""Claims waiting for a time: the holder hands on those claimed ahead of their plan time
when it comes, and the deadlines find those still waiting past their start deadline."""

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django_periodic.engine.claimed import Claim

# Start deadlines of claims no longer waiting kept, beyond twice the claims in flight.
STALE_DEADLINES = 1000


class Holder:
    """Claims made ahead of their plan time, each handed on (``release``) when it comes.

    One thread waits for the earliest; a run therefore starts on time to the millisecond,
    however many were claimed for the same moment.
    """

    def __init__(self, release: Callable[[list[Claim]], None]) -> None:
        self._release = release
        self._heap: list[tuple[float, int, Claim]] = []
        self._order = itertools.count()  # ties in time keep the claim order
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="periodic-holder", daemon=True)
        self._thread.start()

    def hold(self, claim: Claim, starts_at: float) -> None:
        with self._changed:
            heapq.heappush(self._heap, (starts_at, next(self._order), claim))
            if self._heap[0][2] is claim:
                self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while not self._stopped:
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
                due = []
                while self._heap and self._heap[0][0] <= time.monotonic():
                    due.append(heapq.heappop(self._heap)[2])
                self._release(due)


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
        deadline = claim.run.start_deadline
        if claim.run.attempt == 1 and deadline is not None:
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
