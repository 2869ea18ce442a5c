import asyncio
import threading
from concurrent.futures import Future
from dataclasses import replace
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_periodic import JobContext, job, registry
from django_periodic.engine.loop import eventloop, executor
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.workers import WorkerPool
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import claims
from django_periodic.models import Lease, Run
from tests import ledger
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import claimed
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread


@pytest.fixture(autouse=True)
def _close_async_connections():
    """Async jobs' ORM calls run on asgiref's thread, whose connection outlives the test."""
    yield
    # From a thread of its own, like a worker: no event loop of the test's in the way.
    closer = Thread(target=asyncio.run, args=(sync_to_async(connections.close_all)(),))
    closer.start()
    closer.join()


@pytest.mark.django_db
def test_a_job_runs_with_its_arguments_and_its_result_is_kept(process, now):
    claim = claimed(process, now, job="tests.jobs.add", args=[2], kwargs={"b": 3})
    assert ledger.execute(claim) == "succeeded"
    assert Run.objects.get().result == 5


@pytest.mark.django_db
def test_an_exception_fails_the_run_with_code_message_and_traceback(process, now):
    claim = claimed(process, now, job="tests.jobs.explode", kwargs={"message": "kaput"})
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get()
    assert (run.error_code, run.error_message) == ("RuntimeError", "kaput")
    assert "raise RuntimeError(message)" in run.traceback


@pytest.mark.django_db
def test_an_exception_whose_text_cannot_be_had_still_fails_the_run(process, now, clean_registry):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    @job(name="tests.unprintable")
    def unprintable():
        raise Unprintable

    claim = claimed(process, now, job="tests.unprintable")
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get()
    assert run.error_code.endswith(".Unprintable")  # its qualified name
    assert run.error_message == "<exception str() failed>"


@pytest.mark.django_db
def test_an_exception_with_attempts_left_retries(process, now):
    claim = claimed(process, now, job="tests.jobs.explode", max_attempts=2)
    assert ledger.execute(claim) == "retrying"


@pytest.mark.django_db
def test_a_job_that_is_no_longer_registered_fails_without_retry(process, now):
    claim = claimed(process, now, max_attempts=3)
    Run.objects.update(job_name="tests.jobs.gone")
    claim = replace(claim, values=replace(claim.values, job_name="tests.jobs.gone"))
    assert ledger.execute(claim) == "failed"
    assert Run.objects.get().error_code == "unknown_job"


@pytest.mark.django_db
def test_a_job_taking_context_sees_its_run_and_can_heartbeat(process, now):
    claim = claimed(process, now, job="tests.jobs.report_context")
    ledger.execute(claim)
    result = Run.objects.get().result
    assert result["run"] == claim.run.pk
    assert result["attempt"] == 1
    assert result["heartbeat"] is True
    assert result["cancelled"] is False


@pytest.mark.django_db
def test_heartbeat_after_losing_the_lease_cancels_the_job(process, now):
    claim = claimed(process, now)
    ledger.release(claim, now)
    plain = registry.get_job(claim.run.job_name)
    context = JobContext(claim.run, now, 1, executor._lease_extender(claim, plain))
    assert context.heartbeat() is False
    assert context.cancelled
    atomic = registry.get_job("tests.jobs.atomic_heartbeat")
    reading = JobContext(claim.run, now, 1, executor._lease_extender(claim, atomic))
    assert reading.heartbeat() is False  # an atomic job's heartbeat reads the lease too


@pytest.mark.django_db
@pytest.mark.parametrize(
    "reason, status", [(StopRequest.CANCEL, "cancelled"), (StopRequest.TIMEOUT, "failed")]
)
def test_a_run_stopped_before_its_job_started_ends_so_without_calling_it(
    process, now, reason, status
):
    claim = claimed(process, now, job="tests.jobs.record")
    stop = StopRequest()
    stop.set(reason)
    assert ledger.execute(claim, stop) == status
    assert not Execution.objects.exists()


@pytest.mark.django_db
def test_a_run_given_up_at_shutdown_before_its_job_started_is_left_to_the_release(process, now):
    claim = claimed(process, now, job="tests.jobs.record")
    stop = StopRequest()
    stop.set(StopRequest.SHUTDOWN)
    assert executor.run_job(claim, stop) is None
    assert not Execution.objects.exists()


@pytest.mark.django_db
def test_an_async_job_is_awaited_and_its_result_kept(process, now):
    claim = claimed(process, now, job="tests.jobs.add_later", args=[2, 3])
    assert ledger.execute(claim) == "succeeded"
    assert Run.objects.get().result == 5


@pytest.mark.django_db(transaction=True)
def test_an_async_job_can_heartbeat_both_ways_and_read_cancelled(process, now):
    claim = claimed(process, now, job="tests.jobs.report_context_async")
    before = Lease.objects.get().heartbeat_at
    assert ledger.execute(claim) == "succeeded"
    assert Run.objects.get().result == {"heartbeat": True, "aheartbeat": True, "cancelled": False}
    assert Lease.objects.get().heartbeat_at > before


def execute_in_thread(claim: Claim, stop: StopRequest) -> tuple[threading.Thread, list]:
    """Execute like a worker thread does; the list receives the status it returns."""
    status: list = []

    def work() -> None:
        try:
            status.append(ledger.execute(claim, stop))
        finally:
            connections.close_all()  # this thread's own connection

    thread = Thread(target=work)
    thread.start()
    return thread, status


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reason", "status", "code"),
    [(StopRequest.CANCEL, "cancelled", "cancelled"), (StopRequest.TIMEOUT, "failed", "timeout")],
)
def test_an_async_job_is_cancelled_at_its_await_by_cancel_or_timeout(
    process, now, reason, status, code
):
    claim = claimed(process, now, job="tests.jobs.linger_async", kwargs={"seconds": 600})
    stop = StopRequest()
    thread, returned = execute_in_thread(claim, stop)
    wait_for(Execution.objects.exists, 10, "the job to start")
    stop.set(reason)
    thread.join(timeout=10)  # the job would await 600 s if the stop did not cancel it
    assert not thread.is_alive()
    assert returned == [status]
    assert (Run.objects.get().status, Run.objects.get().error_code) == (status, code)


@pytest.mark.django_db(transaction=True)
def test_an_async_job_cancelled_at_shutdown_is_left_to_the_release(process, now):
    claim = claimed(process, now, job="tests.jobs.linger_async", kwargs={"seconds": 600})
    stop = StopRequest()
    thread, returned = execute_in_thread(claim, stop)
    wait_for(Execution.objects.exists, 10, "the job to start")
    stop.set(StopRequest.SHUTDOWN)
    thread.join(timeout=10)
    assert returned == [None]
    assert Run.objects.get().status == "running"  # the scheduler releases it, by token
    assert ledger.release(claim, now)


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_a_base_exception_fails_the_run_without_retry(process, now, name):
    claim = claimed(
        process, now, job="tests.jobs.raise_base_exception", kwargs={"name": name}, max_attempts=3
    )
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get()
    assert (run.status, run.error_code, run.error_message) == ("failed", name, f"{name} from a job")
    assert Lease.objects.get().released_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_worker_lives_on_after_a_job_raises_system_exit(process, now):
    exits = ScheduleFactory(job="tests.jobs.raise_base_exception")
    adds = ScheduleFactory(job="tests.jobs.add", args=[1, 1])
    RunFactory(schedule=exits, plan_time=now)
    RunFactory(schedule=adds, plan_time=now)
    done = threading.Semaphore(0)
    recorder = Recorder()
    pool = WorkerPool(1, on_done=done.release, recorder=recorder)
    try:
        first, second = claims.claim(process, now, 2)
        pool.submit(first)
        pool.submit(second)  # the one thread must survive the first to run it
        for _ in range(2):
            assert done.acquire(timeout=10)
        assert pool.idle()
        assert recorder.flush(timeout=10)
    finally:
        pool.stop()
        recorder.stop()
    statuses = dict(Run.objects.values_list("schedule__job", "status"))
    assert statuses == {"tests.jobs.raise_base_exception": "failed", "tests.jobs.add": "succeeded"}


@pytest.mark.django_db
def test_a_claimed_run_that_waited_past_its_start_deadline_is_skipped_not_started(process, now):
    schedule = ScheduleFactory(misfire_grace=timedelta(seconds=1))
    RunFactory(schedule=schedule, plan_time=now, start_deadline=now + timedelta(seconds=1))
    (claim,) = claims.claim(process, now, 1)
    waited = replace(claim, claimed_at=claim.claimed_at - 5)  # a prefetched claim, 5 s later
    assert ledger.execute(waited) == "skipped"
    run = Run.objects.get()
    assert (run.error_code, run.started_at, run.result) == ("start_deadline", None, None)
    assert Lease.objects.get().outcome == "skipped"


class Pool:
    """A real worker pool and recorder, for a test; ``wait(n)`` waits for n runs to leave it
    and for their outcomes to be recorded."""

    def __init__(self, threads: int) -> None:
        self._left = threading.Semaphore(0)
        self.recorder = Recorder()
        self.pool = WorkerPool(threads, on_done=self._left.release, recorder=self.recorder)

    def submit_all(self, process, now, count: int) -> list[Claim]:
        claimed = claims.claim(process, now, count)
        for claim in claimed:
            self.pool.submit(claim)
        return claimed

    def wait(self, runs: int) -> None:
        for _ in range(runs):
            assert self._left.acquire(timeout=10)
        assert self.recorder.flush(timeout=10)

    def close(self) -> None:
        self.pool.stop()
        self.recorder.stop()


@pytest.fixture
def pool():
    """A pool of two worker threads (``pool.pool``)."""
    started = Pool(2)
    yield started
    started.close()


def plan(now, job: str, **schedule_fields) -> None:
    """A run of ``job`` due now, of a schedule of its own."""
    RunFactory(schedule=ScheduleFactory(job=job, **schedule_fields), plan_time=now)


def result_of(job: str) -> object:
    return Run.objects.get(schedule__job=job).result


@pytest.mark.django_db(transaction=True)
def test_async_jobs_await_side_by_side_on_fewer_threads_than_jobs(process, now, pool):
    # Each run waits until all 20 have arrived: two threads taking them in turn never get
    # there (each run would time out), however slow the machine.
    for _ in range(20):
        plan(now, "tests.jobs.meet", kwargs={"group": f"side-by-side-{now}", "size": 20})
    pool.submit_all(process, now, 20)
    pool.wait(20)
    runs = list(Run.objects.all())
    assert [(run.status, run.result) for run in runs] == [("succeeded", 20)] * 20


@pytest.mark.django_db(transaction=True)
def test_async_runs_share_one_event_loop_on_a_thread_of_its_own(process, now, pool):
    for _ in range(3):
        plan(now, "tests.jobs.nap")
    for _ in range(3):
        pool.submit_all(process, now, 1)
        pool.wait(1)  # one after the other: each could have had a loop of its own
    loop = eventloop.current()
    assert loop is not None
    results = list(Run.objects.values_list("result", flat=True))
    assert results == [{"loop": id(loop.loop), "thread": "periodic-event-loop"}] * 3
    pool.close()
    assert loop.join(timeout=10)  # stopped with the pool


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reason", "status", "code"),
    [(StopRequest.CANCEL, "cancelled", "cancelled"), (StopRequest.TIMEOUT, "failed", "timeout")],
)
def test_an_awaited_run_holds_no_thread_and_stays_in_flight_until_stopped(
    process, now, reason, status, code
):
    plan(now, "tests.jobs.linger_async", kwargs={"seconds": 600})
    plan(now, "tests.jobs.add", args=[1, 1])
    one_thread = Pool(1)
    try:
        claimed = {c.run.job_name: c for c in one_thread.submit_all(process, now, 2)}
        lingering = claimed["tests.jobs.linger_async"]
        one_thread.wait(1)  # the add, on the one thread, while the async job awaits
        assert result_of("tests.jobs.add") == 2
        assert list(one_thread.pool.in_flight()) == [lingering]
        one_thread.pool.in_flight()[lingering].set(reason)
        one_thread.wait(1)
    finally:
        one_thread.close()
    run = Run.objects.get(schedule__job="tests.jobs.linger_async")
    assert (run.status, run.error_code) == (status, code)
    assert one_thread.pool.idle()


@pytest.mark.django_db(transaction=True)
def test_an_awaited_run_cancelled_at_shutdown_leaves_the_pool_for_the_release(process, now, pool):
    plan(now, "tests.jobs.linger_async", kwargs={"seconds": 600})
    (claim,) = pool.submit_all(process, now, 1)
    wait_for(Execution.objects.exists, 10, "the job to start")
    pool.pool.stop_all(StopRequest.SHUTDOWN)
    pool.wait(1)
    assert pool.pool.idle()
    assert Run.objects.get().status == "running"  # nothing recorded: the scheduler releases it
    assert ledger.release(claim, now)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("job", "max_attempts", "status", "code"),
    [
        ("tests.jobs.explode_later", 1, "failed", "RuntimeError"),
        ("tests.jobs.explode_later", 2, "retrying", "RuntimeError"),
        ("tests.jobs.raise_base_exception_async", 3, "failed", "SystemExit"),
    ],
)
def test_an_awaited_job_that_raises_fails_its_run_and_the_loop_lives_on(
    process, now, pool, job, max_attempts, status, code
):
    plan(now, job, max_attempts=max_attempts)
    pool.submit_all(process, now, 1)
    pool.wait(1)
    run = Run.objects.get()
    assert (run.status, run.error_code) == (status, code)
    assert "Traceback" in run.traceback
    plan(now, "tests.jobs.add_later", args=[1, 2])
    pool.submit_all(process, now, 1)
    pool.wait(1)
    assert result_of("tests.jobs.add_later") == 3


@pytest.mark.django_db(transaction=True)
def test_a_job_breaking_out_of_the_event_loop_does_not_stop_it(process, now, pool):
    plan(now, "tests.jobs.break_out_of_the_loop")
    plan(now, "tests.jobs.nap", kwargs={"seconds": 0.2})
    pool.submit_all(process, now, 2)
    pool.wait(2)
    assert result_of("tests.jobs.break_out_of_the_loop") == "carried on"
    assert result_of("tests.jobs.nap")["thread"] == "periodic-event-loop"


@pytest.mark.django_db(transaction=True)
def test_an_async_job_that_never_awaits_and_one_that_heartbeats_run_in_the_pool(process, now, pool):
    plan(now, "tests.jobs.add_at_once", args=[2, 3])
    plan(now, "tests.jobs.report_context_async")
    pool.submit_all(process, now, 2)
    pool.wait(2)
    assert result_of("tests.jobs.add_at_once") == 5
    expected = {"heartbeat": True, "aheartbeat": True, "cancelled": False}
    assert result_of("tests.jobs.report_context_async") == expected


@pytest.mark.django_db(transaction=True)
def test_a_job_blocking_the_loop_still_ends_timed_out_when_it_returns(process, now, pool):
    plan(now, "tests.jobs.block_the_loop", kwargs={"seconds": 1})
    (claim,) = pool.submit_all(process, now, 1)
    wait_for(Execution.objects.exists, 10, "the job to start")
    pool.pool.in_flight()[claim].set(StopRequest.TIMEOUT)  # no await to cancel it at
    pool.wait(1)
    run = Run.objects.get()
    assert (run.status, run.error_code) == ("failed", "timeout")


@pytest.mark.django_db
def test_an_awaited_run_whose_event_loop_ended_first_is_given_up(process, now):
    claim = claimed(process, now, job="tests.jobs.add_later", args=[1, 2])
    called = executor.call_job(claim, StopRequest())
    assert isinstance(called, executor.AsyncRun)
    called.awaitable.close()  # never awaited: as if its loop went away
    gone: Future = Future()
    gone.set_exception(eventloop.EventLoopStopped("The event loop ended before the job."))
    assert executor.record([called.ended(gone)])
    run = Run.objects.get()
    assert (run.status, run.error_code, run.interruptions) == ("failed", "interrupted", 1)
    assert "event loop ended" in run.error_message
