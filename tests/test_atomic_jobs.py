"""Atomic jobs (engine/runs/atomic.py): a job's writes commit with its success, or not at
all. The oracle is what the job wrote (``Execution`` rows), not the run's own status."""

import os
import signal
from datetime import timedelta

import pytest

from django_periodic import job
from django_periodic.db import clock
from django_periodic.engine.runs import claims, leases
from django_periodic.models import Lease, Run, Schedule
from tests import ledger
from tests.helpers import claimed
from tests.models import Execution
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def rows(schedule: str | None = None) -> list[tuple[str, int]]:
    executions = Execution.objects.order_by("pk")
    if schedule is not None:
        executions = executions.filter(schedule=schedule)
    return list(executions.values_list("schedule", "attempt"))


def test_a_success_commits_the_jobs_writes_with_its_outcome(process, now):
    claim = claimed(process, now, name="atomic", job="tests.jobs.atomic_record")
    assert ledger.execute(claim) == "succeeded"
    assert rows() == [("atomic", 1)]
    assert Lease.objects.get().outcome == Lease.Outcome.SUCCEEDED


def test_a_failure_rolls_the_writes_back_and_its_retry_writes_once(process, now):
    claim = claimed(
        process, now, name="atomic", job="tests.jobs.atomic_record",
        kwargs={"fail_first": True}, max_attempts=2,
    )  # fmt: skip
    assert ledger.execute(claim) == "retrying"
    assert rows() == []  # the first attempt wrote, then raised: nothing of it stays
    run = Run.objects.get()
    assert run.error_message == "first attempt fails after writing"
    Run.objects.filter(pk=run.pk).update(next_retry_at=now)
    (retry,) = claims.claim(process, now + timedelta(seconds=1), 1)
    assert ledger.execute(retry) == "succeeded"
    assert rows() == [("atomic", 2)]


@pytest.mark.postgres
def test_a_lost_lease_rolls_the_writes_back_and_records_nothing(postgres, process, now):
    """Another connection releases the lease while the job holds its transaction open
    (SQLite writes one transaction at a time: PostgreSQL only)."""
    claim = claimed(process, now, name="atomic", job="tests.jobs.atomic_loses_its_lease")
    assert ledger.execute(claim) is None
    assert rows() == []
    run = Run.objects.get()
    assert run.status == Run.Status.RUNNING  # left to the sweeper, as any run whose lease was lost


def test_the_jobs_on_commit_hooks_run_only_when_it_committed(process, now):
    claim = claimed(process, now, name="hooked", job="tests.jobs.atomic_with_hook")
    assert ledger.execute(claim) == "succeeded"
    assert rows() == [("hooked", 1), ("on_commit hook", 1)]
    Execution.objects.all().delete()
    failing = claimed(
        process, now, name="failing", job="tests.jobs.atomic_with_hook", kwargs={"fail": True}
    )
    assert ledger.execute(failing) == "failed"
    assert rows() == []


def test_a_job_that_opens_a_durable_block_fails_clearly_and_is_not_retried(process, now):
    claim = claimed(process, now, job="tests.jobs.atomic_durable", max_attempts=3)
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get()
    assert run.error_code == "RuntimeError"
    assert run.error_message.startswith("An atomic job runs inside the transaction")
    assert "durable" in run.error_message
    assert rows() == []


@pytest.mark.postgres
def test_a_job_that_swallows_a_database_error_is_rolled_back_with_a_clear_error(
    postgres, process, now
):
    claim = claimed(process, now, job="tests.jobs.atomic_swallows_an_error", max_attempts=1)
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get()
    assert run.error_code == "AtomicJobError"
    assert "caught inside the job without a savepoint" in run.error_message
    assert rows() == []


def test_an_atomic_run_cut_off_mid_job_is_run_again_whatever_its_schedule_says(process, now):
    """Its process died: nothing of its attempt stayed, so the sweeper re-enters it even
    without allow_stale_reentry (a plain job's run would fail ``lease_expired``)."""
    atomic = claimed(
        process, now, name="atomic", job="tests.jobs.atomic_record", allow_stale_reentry=False
    )
    plain = claimed(process, now, name="plain", job="tests.jobs.record", allow_stale_reentry=False)
    assert leases.mark_started([atomic.token, plain.token]) == {atomic.token, plain.token}
    Lease.objects.update(expires_at=now)
    leases.sweep(now + timedelta(seconds=1))
    assert Run.objects.get(schedule__name="atomic").status == Run.Status.PENDING
    assert Run.objects.get(schedule__name="plain").status == Run.Status.FAILED


@pytest.mark.postgres
@pytest.mark.processes
def test_a_killed_atomic_job_leaves_nothing_and_its_run_is_run_again(children, postgres):
    """SIGKILL while the job holds its writes: they go with the process, and the next
    scheduler runs the run again although its schedule does not allow stale reentry."""
    first = children.start("--workers", "1")
    first.wait_for_line("Recovery done")
    Schedule.objects.create(
        name="atomic", job="tests.jobs.atomic_record", run_at=clock.now(),
        kwargs={"first_waits": 60}, allow_stale_reentry=False,
    )  # fmt: skip
    first.wait_for_line("atomic_record: run")  # it wrote its row, uncommitted, and waits
    first.kill()
    second = children.start("--workers", "1")
    succeeded = Run.objects.filter(status=Run.Status.SUCCEEDED)
    wait_for(succeeded.exists, 30, "the run to be run again and succeed")
    assert second.terminate() == 0
    # The first attempt's row went with its transaction: exactly one row, the second's.
    assert rows() == [("atomic", 2)]
    assert Run.objects.get().interruptions == 1


@pytest.mark.postgres
@pytest.mark.processes
def test_a_frozen_atomic_jobs_late_commit_is_refused_and_leaves_nothing(children, postgres):
    """SIGSTOP while the job holds its writes, until its lease expires and another scheduler
    has run the run again; then SIGCONT: the job returns, its commit finds its lease gone,
    and its writes roll back. The second attempt's row is the only one."""
    quick = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1}
    frozen = children.start("--workers", "1", settings=quick)
    frozen.wait_for_line("Recovery done")
    Schedule.objects.create(
        name="atomic", job="tests.jobs.atomic_record", run_at=clock.now(),
        kwargs={"first_waits": 5}, allow_stale_reentry=False,
        lease_timeout=timedelta(seconds=3),
    )  # fmt: skip
    frozen.wait_for_line("atomic_record: run")  # it wrote its row, uncommitted, and waits
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        heir = children.start("--workers", "1", settings=quick)
        succeeded = Run.objects.filter(status=Run.Status.SUCCEEDED)
        wait_for(succeeded.exists, 60, "the run to be run again and succeed")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    frozen.wait_for_line("ended after losing its lease; its writes were rolled back")
    assert frozen.terminate() == 0 and heir.terminate() == 0
    assert rows() == [("atomic", 2)]
    run = Run.objects.get()
    assert (run.status, run.attempt) == (Run.Status.SUCCEEDED, 2)


def test_an_atomic_jobs_heartbeat_says_its_lease_is_held_without_locking_it(process, now):
    claim = claimed(process, now, job="tests.jobs.atomic_heartbeat")
    heartbeat_at = Lease.objects.get().heartbeat_at
    assert ledger.execute(claim) == "succeeded"
    assert Run.objects.get().result is True
    assert Lease.objects.get().heartbeat_at == heartbeat_at  # not written from its transaction


def test_an_async_job_cannot_be_atomic(clean_registry):
    with pytest.raises(TypeError, match="an atomic job must be a plain function"):

        @job(atomic=True)
        async def fetch():
            pass
