"""The task that executes a handed-off run on a tasks backend's worker (``handoff.py``
enqueues it).

The task claims the run's lease first, so a task delivered twice runs its job once, then
does what ``run_scheduler`` does for the runs its own workers hold: a watcher thread
heartbeats the lease, passes a cancel request on and enforces the timeout, and the
outcome is recorded under the lease's token. Importing this module needs Django's tasks
framework (``taskbackends.framework()``): only the hand-off imports it, when a run is
routed to a backend.
"""

import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections

from django_periodic import claims, clock, executor, leases, taskbackends
from django_periodic.claims import Claim
from django_periodic.conf import get_settings
from django_periodic.context import StopRequest
from django_periodic.models import Run
from django_periodic.outcomes import Outcome

# What the task returns when its run was not claimed (delivered twice, cancelled, done).
NOT_CLAIMED = "not claimed"
# What the task returns when the outcome was not recorded (its lease was lost meanwhile).
NOT_RECORDED = "not recorded"

# django.tasks' decorator (or the backport's): typed here, as the backport ships no stubs
# that mypy could see on every Django version.
task: Callable[..., Callable[[Callable[..., str]], Any]] = taskbackends.framework().task


@task()
def execute_run(run_id: int, using: str = "default") -> str:
    """Claim run ``run_id`` and execute its job under a lease, once however often the task is
    delivered; returns the run's new status, or why there was nothing to do."""
    return execute(run_id, using)


def execute(run_id: int, using: str = "default") -> str:
    """Claim the run and execute it, as ``run_scheduler``'s workers would; the run's new
    status, or why there was nothing to do."""
    claim = claims.claim_run(run_id, _holder(), using)
    if claim is None:
        return NOT_CLAIMED
    try:
        outcome = _run_watched(claim)
    finally:
        # A worker's thread serves many tasks: close the connection as a request would.
        connections[using].close_if_unusable_or_obsolete()
    if outcome is None or not executor.record([outcome]):
        return NOT_RECORDED
    return outcome.status


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()} (task)"


def _run_watched(claim: Claim) -> Outcome | None:
    """Call the job while a watcher thread heartbeats its lease and enforces cancel
    requests and its timeout; None if it was settled meanwhile (timed out, lost)."""
    stop = StopRequest()
    watcher = _Watcher(claim, stop)
    watcher.start()
    try:
        outcome = executor.run_job(claim, stop)
    finally:
        watcher.finish()
    return None if watcher.timed_out else outcome


class _Watcher(threading.Thread):
    """What ``run_scheduler`` does for the runs its workers hold, for one run: heartbeat
    every HEARTBEAT_INTERVAL, pass on a cancel request, enforce the timeout."""

    def __init__(self, claim: Claim, stop: StopRequest) -> None:
        super().__init__(name=f"periodic-watch-{claim.run.pk}", daemon=True)
        self.claim = claim
        self.stop = stop
        self.timed_out = False
        self._done = threading.Event()

    def finish(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        try:
            wait = self._wait(self.claim.db_time(time.monotonic()) or clock.now(self.claim.using))
            while not self._done.wait(wait):
                now = clock.now(self.claim.using)
                if not self._check(now):
                    return
                wait = self._wait(now)
        finally:
            connections.close_all()  # this thread's own

    def _check(self, now: datetime) -> bool:
        """One heartbeat and watch; False once there is nothing left to watch."""
        if not leases.extend(self.claim, now):
            self.stop.set(StopRequest.LEASE_LOST)
            return False
        asked = Run.objects.using(self.claim.using).filter(
            pk=self.claim.run.pk, cancel_requested_at__isnull=False
        )
        self.timed_out = executor.watch(self.claim, self.stop, now, asked.exists())
        return not self.timed_out

    def _wait(self, now: datetime) -> float:
        """Seconds to the next check: the heartbeat, or the timeout (or its grace) if
        sooner."""
        settings = get_settings()
        checks = [now + settings.HEARTBEAT_INTERVAL]
        deadline = executor.timeout_at(self.claim)
        if deadline is not None:
            checks.append(deadline if now < deadline else deadline + settings.TIMEOUT_GRACE)
        return max((min(checks) - now).total_seconds(), 0.0)
