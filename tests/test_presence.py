"""A killed scheduler is known dead by its lost session lock; a frozen one by expiry."""

import os
import signal
from datetime import timedelta

import pytest

from django_periodic.models import Lease, Run, SchedulerProcess
from tests.factories import ScheduleFactory
from tests.models import Execution
from tests.processes import wait_for

pytestmark = [pytest.mark.crash, pytest.mark.processes]


def running_on(child, schedule) -> Lease:
    """Start ``schedule``'s job now and wait until ``child`` runs it; its lease."""
    schedule.run_now()
    executed = Execution.objects.filter(schedule=schedule.name, pid=child.pid)
    wait_for(executed.exists, 30, "the job to start on that process")
    return Lease.objects.get(run__schedule=schedule)


def locked(child) -> bool:
    held = SchedulerProcess.objects.filter(pid=child.pid, locked_at__isnull=False)
    return held.exists()


def test_a_killed_process_s_runs_are_recovered_before_their_leases_expire(postgres, children):
    at_most_once = {"allow_stale_reentry": False, "lease_timeout": timedelta(minutes=5)}
    job = ScheduleFactory(job="tests.jobs.linger", kwargs={"seconds": 120}, **at_most_once)
    victim = children.start("--workers", "1")
    wait_for(lambda: locked(victim), 30, "the victim's session lock")
    lease = running_on(victim, job)
    observer = children.start("--workers", "1")
    wait_for(lambda: locked(observer), 30, "the observer's session lock")

    victim.kill()
    run = Run.objects.filter(pk=lease.run_id, status=Run.Status.FAILED)
    wait_for(run.exists, 60, "the observer to settle the victim's run")
    lease.refresh_from_db()
    assert (lease.outcome, run.get().error_code) == ("expired", "lease_expired")
    assert lease.released_at < lease.expires_at  # by the lost lock, not by expiry
    assert observer.terminate() == 0


def test_a_frozen_process_loses_its_runs_by_expiry_and_its_late_outcome_is_refused(
    postgres, children
):
    quick = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1}
    at_most_once = {"allow_stale_reentry": False, "lease_timeout": timedelta(seconds=3)}
    job = ScheduleFactory(job="tests.jobs.linger", kwargs={"seconds": 6}, **at_most_once)
    frozen = children.start("--workers", "1", settings=quick)
    wait_for(lambda: locked(frozen), 30, "the session lock")
    lease = running_on(frozen, job)
    observer = children.start("--workers", "1", settings=quick)

    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        expired = Lease.objects.filter(pk=lease.pk, outcome="expired")
        wait_for(expired.exists, 60, "the frozen process's lease to expire")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert frozen.terminate() == 0  # after its job, which it could not record
    lease.refresh_from_db()
    assert lease.released_at >= lease.expires_at  # by expiry: its session lock stayed
    run = Run.objects.get(pk=lease.run_id)
    assert (run.status, run.error_code) == ("failed", "lease_expired")
    assert observer.terminate() == 0
