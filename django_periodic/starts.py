"""Marking runs started, durably, before their jobs are called.

After a crash the sweeper must tell a run whose job never started (claimed ahead of its
plan time, or waiting for a thread) from one whose job was running: the first is run
again whatever its schedule's reentry policy, since nothing of it ran; the second follows
that policy. So a worker marks the run's lease started, and that commits, before it calls
the job (``Lease.started_at``).

Threads that start jobs at the same moment (a burst) share one statement: whoever writes
takes every claim waiting to be marked, and the others find theirs done.
"""

import threading
from uuid import UUID

from django_periodic import leases
from django_periodic.claims import Claim


class StartMarks:
    """Marks claims started for the threads of one pool, many per statement."""

    def __init__(self) -> None:
        self._state = threading.Lock()  # guards the two collections below
        self._waiting: list[Claim] = []  # to be marked by the next writer
        self._done: dict[UUID, bool] = {}  # marked by another thread: whether it held
        self._writing = threading.Lock()  # one statement at a time

    def mark(self, claim: Claim) -> bool:
        """Mark ``claim``'s lease started, with every claim other threads are starting now;
        False if the lease was lost (the job must not start). A database error is raised,
        and the other claims of the statement are left for their own threads to mark."""
        with self._state:
            self._waiting.append(claim)
        with self._writing:
            with self._state:
                if claim.token in self._done:
                    return self._done.pop(claim.token)
                batch, self._waiting = self._waiting, []
            try:
                marked = self._write(batch)
            except BaseException:
                with self._state:
                    self._waiting.extend(other for other in batch if other is not claim)
                raise
            with self._state:
                for other in batch:
                    if other is not claim:
                        self._done[other.token] = other.token in marked
        return claim.token in marked

    @staticmethod
    def _write(batch: list[Claim]) -> set[UUID]:
        by_database: dict[str, list[UUID]] = {}
        for claim in batch:
            by_database.setdefault(claim.using, []).append(claim.token)
        marked: set[UUID] = set()
        for using, tokens in by_database.items():
            marked |= leases.mark_started(tokens, using)
        return marked
