"""run_scheduler's retention pass: a background thread, off the loop that plans and claims.

Every ``PRUNE_INTERVAL`` (the first time at most a minute after start) it applies the
retention rules with ``retention.prune()``, batch by batch. With several schedulers only one
prunes at a time; the others find the lock taken and wait for their next interval.

It does not walk the schedules' versions: each new version trims its schedule's (models/
versions.py), so there is nothing to find. Nor the schedules kept by age alone: a pass
reads their distinct rules, and their runs in one set (retention.py).
"""

import logging
import threading

from django.db import DatabaseError, InterfaceError, connections

from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.error_texts import shown
from django_periodic.operations import retention

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

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the batch in progress; wait up to ``timeout`` seconds for it."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        interval = self.interval.total_seconds()
        wait = min(interval, FIRST_PASS_AFTER)
        while not self._stopped.wait(wait):
            try:
                self.prune_once()
            finally:
                # This thread's own connection: not held idle for an interval (an hour by
                # default) against the server's connection budget.
                connections[self.using].close()
            wait = interval

    def prune_once(self) -> retention.Pruned:
        """One pass; a database error ends it (logged), the next interval tries again."""
        pruned = retention.Pruned()
        try:
            now = clock.now(self.using)
            batches = retention.prune(now, using=self.using, stopping=self._stopped.is_set)
            for batch in batches:
                pruned += batch
        except (DatabaseError, InterfaceError) as exc:
            message = "Pruning run history failed (%s); trying again in %s."
            logger.error(message, shown(exc), self.interval)
            connections[self.using].close()
            return pruned
        if pruned.runs:
            logger.info("Retention: deleted %d runs and %d leases.", pruned.runs, pruned.leases)
        return pruned
