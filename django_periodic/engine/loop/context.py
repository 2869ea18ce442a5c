"""What a running job sees of its run: ``JobContext``, and why it should stop.

No models are imported here, so ``from django_periodic import JobContext`` is safe before
the app registry is ready (in type hints of a jobs module, say).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.db import connections

if TYPE_CHECKING:
    from django_periodic.models import Run


class StopRequest:
    """Why a running job should stop, set by its scheduler and read through its context.

    An async job is also cancelled (``asyncio.CancelledError`` at its next ``await``).
    """

    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    TIMEOUT = "timeout"
    CANCEL = "cancel"

    def __init__(self) -> None:
        # A flag, not a threading.Event: nothing waits on it, and one is made per run on
        # the loop thread (an Event's condition costs it 3 us a run).
        self._set = False
        self._lock = threading.Lock()
        self._on_set: Callable[[], None] | None = None
        self.reason = ""

    def set(self, reason: str) -> None:
        with self._lock:
            if self._set:
                return
            self.reason = reason
            self._set = True
            on_set = self._on_set
        if on_set is not None:
            on_set()

    def is_set(self) -> bool:
        return self._set

    def call_on_set(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (from the thread that stops the job) once a reason is set."""
        with self._lock:
            self._on_set = callback
            already = self._set
        if callback is not None and already:
            callback()


def _current_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@dataclass
class JobContext:
    """What a job declared with ``takes_context=True`` receives as its first argument."""

    # The run's model instance, or what builds it when the job first reads ``run``.
    _run: Run | Callable[[], Run] = field(repr=False)
    plan_time: datetime
    attempt: int
    _extend_lease: Callable[[], bool] = field(repr=False)
    _stop: StopRequest = field(default_factory=StopRequest, repr=False)

    @property
    def run(self) -> Run:
        """This run's model instance, with its schedule's (built when first read: a job
        that never reads it costs its scheduler no instance)."""
        if callable(self._run):
            self._run = self._run()
        return self._run

    @property
    def scope(self) -> str:
        """The scope key this run is for (``Schedule.scopes``); empty for an unscoped run."""
        return self.run.scope

    @property
    def cancelled(self) -> bool:
        """True once the job should stop: it was cancelled or timed out, its lease was
        lost, or its scheduler is shutting down. A long job should check it and return."""
        return self._stop.is_set()

    def heartbeat(self) -> bool:
        """Extend this run's lease now; returns False once the job should stop.

        From an async job, prefer ``await context.aheartbeat()``: this blocks the event loop
        for one database round trip.
        """
        if _current_loop() is not None:
            # Django refuses database calls on a thread running an event loop.
            worker = threading.Thread(target=self._extend_and_close, name="periodic-heartbeat")
            worker.start()
            worker.join()
        else:
            self._extend()
        return not self.cancelled

    async def aheartbeat(self) -> bool:
        """``heartbeat()`` for async jobs, without blocking the event loop."""
        await sync_to_async(self._extend)()
        return not self.cancelled

    def _extend_and_close(self) -> None:
        try:
            self._extend()
        finally:
            connections.close_all()  # this short-lived thread's own connection

    def _extend(self) -> None:
        if not self._extend_lease():
            self._stop.set(StopRequest.LEASE_LOST)
