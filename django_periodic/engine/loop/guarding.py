"""The loop's steps guarded: an error is logged, the connections closed, and the next try
backed off 1, 2, 4... 30 s (a stop ends the wait); the process carries on.

A database error is expected (it went away); any other error that reaches the loop is a
bug, logged with its traceback, and must not stop the process either.
"""

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, connections

from django_periodic.engine.loop.stop_signals import StopSignals

logger = logging.getLogger("django_periodic")

MAX_ERROR_BACKOFF = 30.0


class Guard:
    """Runs the loop's steps, counting the failures in a row to back off."""

    def __init__(self, stop: StopSignals, sleep: Callable[[float], None] | None = None) -> None:
        self.stop = stop
        self.failures = 0
        # How a back-off waits: on the loop's alarm unless told (another thread must not
        # take the loop's wake-ups from it).
        self._sleep = sleep or self._sleep_unless_stopped

    def __call__(self, step: Callable[[], object]) -> bool:
        """Run a step; on an error log it, reconnect later, back off 1, 2, 4... 30 s.

        A database error is expected (it went away); any other error is logged with its
        traceback. Neither stops the process: only KeyboardInterrupt and SystemExit,
        which are not Exceptions, do.
        """
        try:
            step()
        except Exception as exc:
            self.failures += 1
            delay = min(2.0 ** (self.failures - 1), MAX_ERROR_BACKOFF)
            if isinstance(exc, (DatabaseError, InterfaceError)):
                logger.error("Database error (%s); retrying in %.0f s.", exc, delay)
            else:
                logger.exception("Unexpected error; retrying in %.0f s.", delay)
            connections.close_all()
            self._sleep(delay)
            return False
        self.failures = 0
        return True

    def _sleep_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.requested and (left := deadline - time.monotonic()) > 0:
            self.stop.alarm.wait(left)
