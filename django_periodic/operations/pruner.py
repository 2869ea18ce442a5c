"""run_scheduler's retention pass: a background thread, off the loop that plans and claims.

Every ``PRUNE_INTERVAL`` (the first time at most a minute after start) it applies the
retention rules with ``retention.prune()``, batch by batch. With several schedulers only one
prunes at a time; the others find the lock taken and wait for their next interval.

A pass first looks, in one transaction, whether there is anything to delete
(``retention.pending``): while nothing is, that transaction is the whole pass, and none of
its statements reads every schedule. The schedules kept by age alone are never walked
(their runs are found in one set), nor are versions (each new one trims its schedule's).
Those with a count rule are walked by the first pass only; a later one reads those whose
runs changed since an earlier look (``prunable.Mark``): the pass before last's, not the last
one's, because a run inserted by a transaction still open at a look may hold a lower id
than the runs it saw, and no transaction lasts a whole interval.
"""

import logging
import threading
from collections import deque
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, connections, transaction

from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.error_texts import shown
from django_periodic.operations import prunable, retention

logger = logging.getLogger("django_periodic")

# The first pass comes this soon after start (or the interval, if shorter), so that
# schedulers restarted more often than the interval still prune.
FIRST_PASS_AFTER = 60.0


class Pruner(threading.Thread):
    """Deletes the runs no retention rule keeps, every ``PRUNE_INTERVAL``, until stopped."""

    def __init__(self, using: str) -> None:
        super().__init__(name="periodic-pruner", daemon=True)
        self.using = using
        self.interval = get_settings().PRUNE_INTERVAL
        self._stopped = threading.Event()
        # The looks of the last passes done (the first at start, look_at_start): a pass
        # reads the schedules with a count rule whose runs changed since the older, else
        # (before two) walks them all.
        self._marks: deque[prunable.Mark] = deque(maxlen=2)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the batch in progress; wait up to ``timeout`` seconds for it."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        interval = self.interval.total_seconds()
        wait = min(interval, FIRST_PASS_AFTER)
        self._step(self.look_at_start)
        while not self._stopped.wait(wait):
            self._step(self.prune_once)
            wait = interval

    def _step(self, step: Callable[[], object]) -> None:
        try:
            step()
        finally:
            # This thread's own connection: kept between passes no further apart than the
            # loop's wake-ups, which keep theirs (a new connection costs statements); else
            # closed, not held idle for an interval (an hour by default) against the
            # server's connection budget.
            if self.interval > get_settings().IDLE_INTERVAL:
                connections[self.using].close()

    def look_at_start(self) -> None:
        """Mark the start (``prunable.mark``): the second pass reads the changes since, the
        first walks. Without it (the database is away), the second pass walks too."""
        try:
            self._marks.append(prunable.mark(clock.now(self.using), self.using))
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Pruning: could not mark the start (%s).", shown(exc))

    def prune_once(self) -> retention.Pruned:
        """One pass; a database error ends it (logged), the next interval tries again."""
        pruned = retention.Pruned()
        since = self._marks[0] if len(self._marks) == self._marks.maxlen else None
        try:
            # The look: while nothing is to be deleted, this one transaction is the pass.
            with transaction.atomic(using=self.using):
                now = clock.now(self.using)
                looked = prunable.mark(now, self.using)
                found = retention.pending(now, using=self.using, since=since)
            if found:
                stopping = self._stopped.is_set
                for batch in retention.prune(now, using=self.using, stopping=stopping, since=since):
                    pruned += batch
        except (DatabaseError, InterfaceError) as exc:
            message = "Pruning run history failed (%s); trying again in %s."
            logger.error(message, shown(exc), self.interval)
            connections[self.using].close()
            return pruned
        if not (pruned.busy or self._stopped.is_set()):
            self._marks.append(looked)  # a pass cut short leaves its changes to the next
        if pruned.runs:
            logger.info("Retention: deleted %d runs and %d leases.", pruned.runs, pruned.leases)
        return pruned
