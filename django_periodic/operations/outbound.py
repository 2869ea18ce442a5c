"""Calls to the outside world (a monitor's check-in, a ping) made by a thread of their own,
never by the thread that asked: a scheduler's loop, its recorder, a task's worker.

``Sender.post()`` never blocks: it queues the call, up to ``size`` waiting. One daemon
thread, started with the first call, makes them in order, each once: a call that raises is
logged and not retried, so a monitor that is down costs one attempt per event, never a
storm. A server that hangs holds up that thread only, for as long as the call's own
timeout; meanwhile calls queue, and past ``size`` they are dropped, counted, and the count
logged once the queue has room again. At exit the thread gets ``PATIENCE`` to make what
is queued, then is abandoned.
"""

import atexit
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable

logger = logging.getLogger("django_periodic")

# The namespace of attempt ids (uuid5): fixed, so that every process derives the same one.
ATTEMPT_NAMESPACE = uuid.UUID("6f1c2a4e-3b8d-5e7f-9a01-c2d3e4f5a6b7")

# Calls waiting at most: a minute of runs at a few hundred a second.
SIZE = 10_000
# At exit, how long the thread may still take to make what is queued (seconds).
PATIENCE = 5.0


def attempt_id(run_id: int | None, attempt: int) -> uuid.UUID:
    """The id a monitor pairs an attempt's start and end by (a check-in's id, a ping's
    ``rid``): derived from the run and attempt, so the process that ends an attempt (another
    one's sweeper, after a lease was lost) names the one the starting process opened."""
    return uuid.uuid5(ATTEMPT_NAMESPACE, f"{run_id}.{attempt}")


class Sender:
    """Calls queued by any thread and made, in order, by a daemon thread of its own.

    ``name`` names the thread and, in logs, what is sent ("Sentry check-ins", "pings"):
    never a call's arguments, which may hold secrets (a ping URL). ``close_at_exit=False``
    leaves ``close()`` to the owner (several senders sharing one ``PATIENCE`` at exit).
    """

    def __init__(self, name: str, *, size: int = SIZE, close_at_exit: bool = True) -> None:
        self.name = name
        self._size = size
        self._close_at_exit = close_at_exit
        self._calls: deque[Callable[[], object]] = deque()
        self._changed = threading.Condition()
        self._busy = False
        self._dropped = 0
        self._thread: threading.Thread | None = None

    def post(self, call: Callable[[], object]) -> bool:
        """Queue ``call`` without waiting; False if ``size`` calls already wait (it is
        dropped and counted)."""
        with self._changed:
            if len(self._calls) >= self._size:
                if not self._dropped:
                    logger.warning(
                        "%s: %d wait to be sent; more are dropped until there is room.",
                        self.name,
                        self._size,
                    )
                self._dropped += 1
                return False
            self._calls.append(call)
            self._start()
            self._changed.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued call to be made (or to fail and be
        logged); True if they were."""
        with self._changed:
            return self._changed.wait_for(self._idle, timeout)

    def close(self) -> None:
        """At exit: ``PATIENCE`` to make what is queued, then the thread is abandoned."""
        if self._thread is not None and not self.flush(PATIENCE):
            logger.warning("%s: not all were sent in %s s before exit.", self.name, PATIENCE)

    def _idle(self) -> bool:
        return not (self._calls or self._busy)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"django_periodic.{self.name}", daemon=True
            )
            self._thread.start()
            if self._close_at_exit:
                atexit.register(self.close)

    def _run(self) -> None:
        while True:
            call = self._next()
            try:
                call()
            except Exception:
                logger.exception("%s: one could not be sent (not retried).", self.name)
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _next(self) -> Callable[[], object]:
        with self._changed:
            self._changed.wait_for(lambda: self._calls)
            if self._dropped:
                logger.warning("%s: %d were dropped for want of room.", self.name, self._dropped)
                self._dropped = 0
            self._busy = True
            return self._calls.popleft()
