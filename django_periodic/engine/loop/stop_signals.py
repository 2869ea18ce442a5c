"""SIGTERM and SIGINT for ``run_scheduler``: counted, never acted on in the handler.

The handler only increments a counter and writes one byte to the scheduler's alarm pipe
(no lock, so it cannot deadlock against the code it interrupts); the loop reads the count:
the first signal starts a graceful stop, the second ends the wait for running jobs.

``run_scheduler`` installs the handlers while the apps load (see ``apps.py``), so a
SIGTERM sent while the process is still starting also ends it cleanly, with status 0.
"""

import signal
import sys
import threading
from types import FrameType

from django_periodic.engine.loop.wakeups import Alarm

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
COMMAND = "run_scheduler"


class StopSignals:
    """How many stops were asked for, and the alarm that wakes the loop when one is."""

    def __init__(self) -> None:
        self.received = 0
        self.alarm = Alarm()
        self._previous: dict[int, object] = {}

    def request(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Ask for a stop (the signal handler; safe from any thread too)."""
        self.received += 1
        self.alarm.set()

    @property
    def requested(self) -> bool:
        return self.received > 0

    @property
    def hurried(self) -> bool:
        """A second stop was asked for: stop waiting for running jobs."""
        return self.received > 1

    def install(self) -> None:
        """Handle SIGTERM and SIGINT from now on (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self.request)

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()


_process_signals: StopSignals | None = None


def for_process() -> StopSignals:
    """This process's stop signals, installed: those installed at start, if they were."""
    global _process_signals
    if _process_signals is None:
        _process_signals = StopSignals()
    _process_signals.install()
    return _process_signals


def release_process() -> None:
    """Uninstall and forget this process's stop signals (when the command ends)."""
    global _process_signals
    if _process_signals is not None:
        _process_signals.uninstall()
        _process_signals = None


def starting_scheduler(argv: list[str] | None = None) -> bool:
    """Whether this process was started as ``manage.py run_scheduler`` (or django-admin)."""
    argv = sys.argv if argv is None else argv
    return len(argv) > 1 and argv[1] == COMMAND
