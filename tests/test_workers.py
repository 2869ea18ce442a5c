import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction

from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.holding import STALE_DEADLINES, Deadlines, Holder
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.scheduler import Scheduler
from django_periodic.engine.loop.workers import MAX_AWAITING, WorkerPool
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import claims, outcomes
from django_periodic.models import Lease, Run, Schedule
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread

LEAD = timedelta(minutes=2)


@contextmanager
def cancelled_at_the_end(size: int, **options):
    """A pool of ``size`` threads and a semaphore released each time a run leaves it. At the
    end, the job still running (one) is cancelled and its outcome recorded."""
    done = threading.Semaphore(0)
    recorder = Recorder()
    pool = WorkerPool(size, on_done=done.release, recorder=recorder, **options)
    try:
        yield pool, done
        pool.stop_all(StopRequest.CANCEL)
        assert done.acquire(timeout=10)
        assert recorder.flush(timeout=10)
    finally:
        pool.stop()
        recorder.stop()


def claimed_ahead(process, now, seconds: float, **schedule_fields) -> Claim:
    """A run of ``tests.jobs.record`` due in ``seconds``, claimed ahead of its plan time."""
    schedule = ScheduleFactory(job="tests.jobs.record", **schedule_fields)
    RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=seconds))
    (claim,) = claims.claim(process, now, 1, ahead=LEAD)
    return claim


@pytest.mark.django_db(transaction=True)
def test_a_run_claimed_ahead_is_held_and_starts_at_its_plan_time_never_before(process, now):
    claim = claimed_ahead(process, now, 2)
    done = threading.Semaphore(0)
    recorder = Recorder()
    pool = WorkerPool(2, on_done=done.release, recorder=recorder)
    try:
        pool.submit(claim)
        assert not Execution.objects.exists()  # held, not started
        assert pool.free() == 2  # a held run does not take a thread from runs due now
        assert done.acquire(timeout=30)
        assert recorder.flush(timeout=10)
    finally:
        pool.stop()
        recorder.stop()
    run = Run.objects.get()
    assert run.status == "succeeded"
    assert run.started_at >= run.plan_time
    assert Execution.objects.get().executed_at >= run.plan_time


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reentry", [False, True])
def test_a_run_held_for_its_plan_time_goes_back_to_pending_at_shutdown(process, now, reentry):
    """Never started, so not run again elsewhere as a second attempt, nor failed."""
    claim = claimed_ahead(process, now, 60, allow_stale_reentry=reentry)
    scheduler = Scheduler(workers=2)
    scheduler.process = process
    scheduler.pool.submit(claim)
    scheduler.stop.request()
    scheduler.shutdown()  # does not wait out the grace for a run that has not started
    run = Run.objects.get()
    assert (run.status, run.attempt, run.interruptions) == ("pending", 1, 1)
    assert Lease.objects.get().outcome == "released"
    assert not Execution.objects.exists()
    another = SchedulerProcessFactory()
    assert [c.run.pk for c in claims.claim(another, run.plan_time, 1)] == [run.pk]


@pytest.mark.django_db(transaction=True)
def test_a_claim_waiting_past_its_start_deadline_is_withdrawn_without_a_thread(process, now):
    schedule = ScheduleFactory(job="tests.jobs.record")
    RunFactory(
        schedule=schedule,
        plan_time=now + timedelta(seconds=60),
        start_deadline=now + timedelta(seconds=1),
    )
    (claim,) = claims.claim(process, now, 1, ahead=LEAD)
    waited = replace(claim, db_claimed_at=now + timedelta(seconds=5))  # as if 5 s later
    pool = WorkerPool(1, on_done=lambda: None, recorder=Recorder())
    try:
        pool.submit(waited)
        assert pool.withdraw_late() == [waited]
        assert pool.idle()
    finally:
        pool.stop()
    assert not Execution.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_only_claims_past_their_start_deadline_are_withdrawn_earliest_first(process, now):
    for seconds in (30, 2, 1):
        schedule = ScheduleFactory(job="tests.jobs.record")
        RunFactory(
            schedule=schedule,
            plan_time=now + timedelta(seconds=60),
            start_deadline=now + timedelta(seconds=seconds),
        )
    claimed = claims.claim(process, now, 3, ahead=LEAD)
    waited = [replace(c, db_claimed_at=now + timedelta(seconds=5)) for c in claimed]
    by_deadline = sorted(waited, key=lambda c: c.run.start_deadline)
    pool = WorkerPool(1, on_done=lambda: None, recorder=Recorder())
    try:
        for claim in waited:
            pool.submit(claim)
        assert pool.withdraw_late() == by_deadline[:2]
        assert pool.next_start_deadline() == now + timedelta(seconds=30)
        assert list(pool.in_flight()) == by_deadline[2:]
    finally:
        pool.stop()


def test_the_start_deadlines_of_claims_gone_are_not_kept():
    """A deadline stays when its claim starts or leaves; all such are dropped once they
    outnumber the claims in flight, so a busy pool's memory does not grow."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    waiting: set[Claim] = set()
    deadlines = Deadlines(waiting.__contains__, lambda: len(waiting))

    def claim(seconds: int) -> Claim:
        run = Run(attempt=1, start_deadline=now + timedelta(seconds=seconds), schedule=Schedule())
        return Claim.of(run, uuid.uuid4())

    first = claim(0)
    waiting.add(first)
    deadlines.add(first)
    for seconds in range(1, 5001):
        deadlines.add(claim(seconds))  # started and gone at once
    assert deadlines.earliest() == first.run.start_deadline
    assert len(deadlines._heap) <= 2 * len(waiting) + STALE_DEADLINES
    waiting.clear()
    assert deadlines.earliest() is None


@pytest.mark.django_db(transaction=True)
def test_free_threads_do_not_count_an_async_run_being_awaited(process, now):
    schedule = ScheduleFactory(job="tests.jobs.linger_async", kwargs={"seconds": 600})
    RunFactory(schedule=schedule, plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    with cancelled_at_the_end(1) as (pool, _):
        pool.submit(claim)
        wait_for(Execution.objects.exists, 10, "the async job to start")
        wait_for(lambda: pool.free() == 1, 10, "its thread to be free")
        assert pool.starving() and not pool.idle()
    assert Run.objects.get().status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_half_of_what_a_pool_takes_free_is_worth_a_claim_whatever_the_prefetch(process, now):
    """``free()`` never exceeds ``MAX_AWAITING``: with a prefetch beyond it, half of that
    free is worth a claim while every thread is busy (half the capacity never would be)."""
    with cancelled_at_the_end(1, prefetch=2 * MAX_AWAITING) as (pool, done):
        RunFactory(schedule=ScheduleFactory(job="tests.jobs.noop"), plan_time=now)
        pool.submit(*claims.claim(process, now, 1))
        assert done.acquire(timeout=10)  # a short job: the prefetch counts from now on
        long_job = ScheduleFactory(job="tests.jobs.linger", kwargs={"seconds": 600})
        RunFactory(schedule=long_job, plan_time=now)
        pool.submit(*claims.claim(process, now, 1))
        wait_for(Execution.objects.exists, 10, "the long job to start")
        assert not pool.starving()
        assert pool.free() == MAX_AWAITING
        assert pool.worth_claiming()


@pytest.mark.django_db(transaction=True)
def test_the_recorder_holds_an_outcome_until_it_is_recorded(postgres, process, now):
    """Its lease is still this process's to renew meanwhile (``Recorder.holding``)."""
    RunFactory(plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    locked, unlock = threading.Event(), threading.Event()

    def hold_the_lease_locked():  # as a slow statement would, the recorder waits for it
        with transaction.atomic():
            Lease.objects.select_for_update().get(token=claim.token)
            locked.set()
            unlock.wait(10)
        connections.close_all()

    locker = Thread(target=hold_the_lease_locked)
    locker.start()
    recorder = Recorder()
    try:
        assert locked.wait(10)
        recorder.put(outcomes.succeeded(claim, 1))
        assert recorder.holding() == {claim.token}
        unlock.set()
        assert recorder.flush(timeout=10)
        assert recorder.holding() == set()
    finally:
        unlock.set()
        locker.join()
        recorder.stop()
    assert Run.objects.get().status == "succeeded"


def test_the_holder_prepares_claims_a_lead_before_their_release_and_releases_them_once():
    """``prepare`` (the start marks) gets the claims coming within ``lead`` first, never
    before then; each is released once, at its time or after, never before it is prepared."""
    events: list[tuple[str, float, list[Claim]]] = []
    released = threading.Semaphore(0)
    lead = 0.2

    def note(kind: str):
        def noted(claims: list[Claim]) -> None:
            events.append((kind, time.monotonic(), claims))
            if kind == "release":
                for _ in claims:
                    released.release()

        return noted

    holder = Holder(note("release"), note("prepare"), lambda: lead)
    start = time.monotonic()
    unsaved = Run(schedule=Schedule())
    held = {Claim.of(unsaved, uuid.uuid4()): start + offset for offset in (0.3, 0.3, 0.6)}
    try:
        for claim, starts_at in held.items():
            holder.hold(claim, starts_at)
        for _ in held:
            assert released.acquire(timeout=30)
    finally:
        holder.stop()
    at = {(kind, claim): when for kind, when, claims in events for claim in claims}
    assert sum(len(claims) for _, _, claims in events) == 2 * len(held)  # each once of each
    for claim, starts_at in held.items():
        assert starts_at - lead <= at["prepare", claim] <= at["release", claim]
        assert at["release", claim] >= starts_at
