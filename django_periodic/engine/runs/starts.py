"""Marking runs started, durably, before their jobs are called.

After a crash the sweeper must tell a run whose job never started (claimed ahead of its
plan time, or waiting for a thread) from one whose job was running: the first is run
again whatever its schedule's reentry policy, since nothing of it ran; the second follows
that policy. So a worker marks the run's lease started, and that commits, before it calls
the job (``Lease.started_at``).

Threads that start jobs at the same moment (a burst) share one statement: whoever writes
takes every claim waiting to be marked, and the others find theirs done. With jobs shorter
than a statement's round trip, the writer also marks the claims that threads will take
within about that round trip (``upcoming``): a burst of short jobs then costs a statement
per round trip, not one per thread each time. Such a claim is marked a moment (about one
round trip) before its thread calls the job, as every claim is marked a moment before.

An atomic job's run is not marked (``_needs_no_mark``): after a crash it runs again
whether its job started or not, since nothing of it stays unless its outcome commits.

Claims held for their plan time are marked by the thread that holds them, all those due at
one moment in one statement, about a round trip before it releases them (``mark_ahead``,
holding.py): a burst's marks are then written by the time it is due, not after.
"""

import threading
import time
from collections.abc import Callable
from uuid import UUID

from django_periodic import registry
from django_periodic.engine.runs import leases
from django_periodic.engine.runs.claim_types import Claim

# Weight of the latest statement in the running average of a mark's round trip.
ROUND_TRIP_WEIGHT = 0.2


class StartMarks:
    """Marks claims started for the threads of one pool, many per statement."""

    def __init__(self) -> None:
        self._state = threading.Lock()  # guards the two collections below
        self._waiting: list[Claim] = []  # to be marked by the next writer
        self._done: dict[UUID, bool] = {}  # marked by another thread: whether it held
        self._writing = threading.Lock()  # one statement at a time
        self.round_trip = 0.0  # seconds a mark takes, on average (0: none written yet)

    def mark(
        self, claim: Claim, upcoming: Callable[[], tuple[list[Claim], int]] = lambda: ([], 0)
    ) -> bool:
        """Mark ``claim``'s lease started, with every claim other threads are starting now;
        False if the lease was lost (the job must not start). ``upcoming()`` gives the claims
        waiting for a thread, in the order threads take them, and how many of them threads
        will take within about a round trip: those not marked yet are marked too.

        A database error is raised, and the other claims of the statement are left for
        their own threads to mark."""
        if _needs_no_mark(claim):
            return True
        with self._state:
            if claim.token in self._done:
                return self._done.pop(claim.token)  # marked with an earlier statement
            self._waiting.append(claim)
        with self._writing:
            with self._state:
                if claim.token in self._done:
                    return self._took(claim)
                batch, self._waiting = self._waiting, []
                ahead = self._ahead(batch, *upcoming())
            try:
                marked = self._write(batch + ahead)
            except BaseException:
                with self._state:
                    self._waiting.extend(other for other in batch if other is not claim)
                raise
            with self._state:
                for other in batch + ahead:
                    if other is not claim:
                        self._done[other.token] = other.token in marked
        return claim.token in marked

    def mark_ahead(self, claims: list[Claim]) -> None:
        """Mark claims that no thread has taken yet (held for their release, about to come),
        in one statement: their threads then find them marked. A database error is raised,
        and the claims are left for their threads to mark."""
        claims = [claim for claim in claims if not _needs_no_mark(claim)]
        if not claims:
            return
        with self._writing:
            marked = self._write(claims)
            with self._state:
                for claim in claims:
                    self._done[claim.token] = claim.token in marked

    def _ahead(self, batch: list[Claim], waiting: list[Claim], soon: int) -> list[Claim]:
        """The first ``soon`` claims waiting that are not marked and not in ``batch``."""
        taken = {claim.token for claim in batch} | self._done.keys()
        unmarked = [c for c in waiting if c.token not in taken and not _needs_no_mark(c)]
        return unmarked[:soon]

    def forget(self, claims: list[Claim]) -> None:
        """Drop what is known of claims that no thread will take (withdrawn)."""
        with self._state:
            for claim in claims:
                self._done.pop(claim.token, None)

    def _took(self, claim: Claim) -> bool:
        """Marked ahead while this thread waited to write (call with ``_state`` held)."""
        if claim in self._waiting:
            self._waiting.remove(claim)
        return self._done.pop(claim.token)

    def _write(self, batch: list[Claim]) -> set[UUID]:
        started = time.monotonic()
        by_database: dict[str, list[UUID]] = {}
        for claim in batch:
            by_database.setdefault(claim.using, []).append(claim.token)
        marked: set[UUID] = set()
        for using, tokens in by_database.items():
            marked |= leases.mark_started(tokens, using)
        took = time.monotonic() - started
        self.round_trip += ROUND_TRIP_WEIGHT * (took - self.round_trip) if self.round_trip else took
        return marked


def _needs_no_mark(claim: Claim) -> bool:
    """An atomic job's run is not marked: nothing of it stays unless its outcome commits,
    so after a crash it is run again whether its job started or not
    (``retries.may_run_again``), and its claim, its transaction and nothing else is what
    it costs."""
    return registry.is_atomic(claim.run.job_name)
