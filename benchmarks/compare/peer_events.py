"""The event log a peer's process appends to (stdlib only: it runs in every peer's venv).

One line per event, ``<kind> <number>...``, line-buffered so that the harness sees each
event as it happens; see harness.EventLog for the kinds.
"""

import os
import threading
import time


class Events:
    """Appends events to the file named by $BENCH_EVENTS (or drops them when unset)."""

    def __init__(self, path: str | None = None) -> None:
        path = path or os.environ.get("BENCH_EVENTS")
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, kind: str, *numbers: float) -> None:
        if self._file is None:
            return
        line = " ".join([kind, *(f"{n:.6f}" for n in numbers)]) + "\n"
        with self._lock:
            self._file.write(line)

    def now(self, kind: str, *numbers: float) -> None:
        """An event stamped with the current time (after ``numbers``)."""
        self.write(kind, *numbers, time.time())


EVENTS = Events()
