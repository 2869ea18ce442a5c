"""The event loop that async jobs are awaited on: one per process, on a thread of its own.

Coroutines submitted from any thread run side by side on it, so a run that awaits I/O holds
no worker thread, and no run pays for an event loop of its own. The loop starts with the
first async job and stops with the worker pool, once the coroutines it awaits are done. As
in any asyncio program, a job that blocks the loop (a CPU-bound stretch, a synchronous call
not wrapped in ``sync_to_async``) stalls every other async job of its process meanwhile.
"""

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger("django_periodic")

T = TypeVar("T")


class EventLoopStopped(Exception):
    """The event loop ended before a coroutine submitted to it did."""


class EventLoop:
    """An asyncio event loop on a daemon thread, awaiting coroutines submitted from any thread.

    Nothing a coroutine does ends the thread: an exception that breaks out of the loop (a
    job's own callback raising ``SystemExit``, say) is logged and the loop carries on, as
    it does when a job stops it. Only ``stop()`` ends it.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._awaited: set[concurrent.futures.Future[Any]] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="periodic-event-loop", daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Await ``coroutine`` on the loop; the future returned is done when it is."""
        with self._lock:
            if self._stopping:
                coroutine.close()  # never awaited: say so once, here, not in a warning
                raise EventLoopStopped("This event loop is stopping.")
            future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
            self._awaited.add(future)
        future.add_done_callback(self._forget)
        return future

    def accepting(self) -> bool:
        """Whether ``submit()`` takes coroutines: not stopping, and its thread alive."""
        with self._lock:
            return not self._stopping and self._thread.is_alive()

    def stop(self) -> None:
        """Take no more coroutines; end the loop once those it awaits are done."""
        with self._lock:
            self._stopping = True
            idle = not self._awaited
        if idle:
            self._wake_to_stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop's thread to end; False if it still runs after ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._awaited.discard(future)
            last = self._stopping and not self._awaited
        if last:
            self._wake_to_stop()

    def _wake_to_stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _finished(self) -> bool:
        with self._lock:
            return self._stopping and not self._awaited

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while not self._finished():
                self._run_until_stopped()
        finally:
            self._close()

    def _run_until_stopped(self) -> None:
        try:
            self.loop.run_forever()
        except BaseException:
            # SystemExit or KeyboardInterrupt from a job's own callback or task: asyncio lets
            # them out of run_forever(). The other coroutines are intact: carry on.
            logger.exception("An async job broke out of the event loop; the loop carries on.")

    def _close(self) -> None:
        """Close the loop; should its thread end unexpectedly, fail what it still awaited,
        so that each run is settled (given up) rather than left running."""
        with self._lock:
            self._stopping = True
            left = list(self._awaited)
        for future in left:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(EventLoopStopped("The event loop ended before the job."))
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


_shared: EventLoop | None = None
_shared_lock = threading.Lock()


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Await ``coroutine`` on this process's event loop, starting one if none runs."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.accepting():
            _shared = EventLoop()
        return _shared.submit(coroutine)


def current() -> EventLoop | None:
    """This process's event loop, if one runs."""
    with _shared_lock:
        return _shared


def stop() -> None:
    """Stop this process's event loop once the coroutines it awaits are done; the next
    ``submit()`` starts a new one."""
    global _shared
    with _shared_lock:
        loop, _shared = _shared, None
    if loop is not None:
        loop.stop()
