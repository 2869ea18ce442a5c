"""Recording outcomes off the worker threads: one thread writes them, as many per statement
as have arrived while it wrote the last, and says which leases are still held meanwhile."""

import logging
import queue
import threading
from collections.abc import Callable
from uuid import UUID

from django.db import connections

from django_periodic.engine.loop import executor, worker_connections
from django_periodic.engine.records import AttemptOutcome

logger = logging.getLogger("django_periodic")

# At most this many outcomes in one statement.
MAX_RECORD_BATCH = 500


class Recorder:
    """One thread that records outcomes in batches: whatever arrived while it wrote the last.

    ``on_recorded`` is called (on the recorder thread) after each batch.
    """

    def __init__(self, on_recorded: Callable[[], None] = lambda: None) -> None:
        self._queue: queue.SimpleQueue[AttemptOutcome | None] = queue.SimpleQueue()
        self._on_recorded = on_recorded
        self._pending = 0
        self._holding: set[UUID] = set()  # the lease tokens of the outcomes pending
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="periodic-recorder", daemon=True)
        self._thread.start()

    def put(self, outcome: AttemptOutcome) -> None:
        with self._idle:
            self._pending += 1
            self._holding.add(outcome.claim.token)
        self._queue.put(outcome)

    def holding(self) -> set[UUID]:
        """The lease tokens of the outcomes put and not yet recorded (nor given up): runs
        this process still holds, whose leases its heartbeat extends."""
        with self._idle:
            return set(self._holding)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every outcome put so far is recorded (or given up); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Record what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first, *self._drain(MAX_RECORD_BATCH - 1)]
            stop = None in batch
            outcomes = [outcome for outcome in batch if outcome is not None]
            self._record(outcomes)
            if stop:
                break
        connections.close_all()  # this thread's own connections

    def _drain(self, limit: int) -> list[AttemptOutcome | None]:
        drained: list[AttemptOutcome | None] = []
        while len(drained) < limit:
            try:
                drained.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return drained

    def _record(self, outcomes: list[AttemptOutcome]) -> None:
        by_database: dict[str, list[AttemptOutcome]] = {}
        for outcome in outcomes:
            by_database.setdefault(outcome.claim.using, []).append(outcome)
        try:
            for batch in by_database.values():
                self._record_batch(batch)
        finally:
            with self._idle:
                self._pending -= len(outcomes)
                self._holding.difference_update(o.claim.token for o in outcomes)
                self._idle.notify_all()
            self._on_recorded()

    def _record_batch(self, batch: list[AttemptOutcome]) -> None:
        try:
            worker_connections.prepare_for_run()
            executor.record(batch)
        except Exception:
            # The database stayed away. No longer held here, the runs' leases are not
            # extended any more: they expire, and the sweeper settles the runs.
            logger.exception("Could not record the outcomes of %d runs.", len(batch))
