"""The ledger knows, before a job is called, that it started; a crash re-enters the rest."""

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_periodic.db import clock
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.workers import WorkerPool
from django_periodic.engine.runs import claims, leases, starts
from django_periodic.engine.runs.claim_types import Claim
from django_periodic.models import Lease, Run, Schedule
from tests.factories import RunFactory, ScheduleFactory
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread


@pytest.fixture
def written(monkeypatch) -> list[int]:
    """How many leases each start-mark statement names, in order (the statements still run)."""
    counts: list[int] = []
    real_mark_started = leases.mark_started

    def mark_started(tokens, using="default"):
        counts.append(len(tokens))
        return real_mark_started(tokens, using)

    monkeypatch.setattr(leases, "mark_started", mark_started)
    return counts


@pytest.mark.django_db(transaction=True)
def test_threads_starting_at_once_share_one_statement(process, now, monkeypatch):
    """While one thread writes, the claims of the threads that arrive meanwhile wait, and
    the next writer marks them all in one statement."""
    schedule = ScheduleFactory(overlap=Schedule.Overlap.CONCURRENT)
    for i in range(5):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    first, *others = claims.claim(process, now, 5)
    written: list[int] = []
    writing, go_on = threading.Event(), threading.Event()
    real_mark_started = leases.mark_started

    def mark_started(tokens, using="default"):
        written.append(len(tokens))
        if len(written) == 1:
            writing.set()
            go_on.wait(30)
        return real_mark_started(tokens, using)

    monkeypatch.setattr(leases, "mark_started", mark_started)
    marks = starts.StartMarks()
    marked: dict[Claim, bool] = {}

    def start(claim: Claim) -> None:
        try:
            marked[claim] = marks.mark(claim)
        finally:
            connections.close_all()  # this thread's own

    threads = [Thread(target=start, args=(first,))]
    threads[0].start()
    assert writing.wait(30)
    threads += [Thread(target=start, args=(claim,)) for claim in others]
    for thread in threads[1:]:
        thread.start()
    wait_for(lambda: len(marks._waiting) == len(others), 30, "the others to wait")
    go_on.set()
    for thread in threads:
        thread.join(30)
    assert written == [1, len(others)]
    assert marked == {claim: True for claim in [first, *others]}
    assert not Lease.objects.filter(started_at__isnull=True).exists()


@pytest.mark.django_db
def test_claims_a_thread_will_take_soon_are_marked_with_the_writers_and_cost_no_statement(
    process, now, written
):
    schedule = ScheduleFactory(overlap=Schedule.Overlap.CONCURRENT)
    for i in range(4):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    first, *upcoming = claims.claim(process, now, 4)
    marks = starts.StartMarks()
    assert marks.mark(first, lambda: (upcoming, 3))
    assert not Lease.objects.filter(started_at__isnull=True).exists()
    assert [marks.mark(claim) for claim in upcoming] == [True] * 3
    assert written == [4]
    assert marks.round_trip > 0
    assert not marks._done and not marks._waiting


@pytest.mark.django_db
def test_a_withdrawn_claim_marked_ahead_is_forgotten(process, now):
    schedule = ScheduleFactory(overlap=Schedule.Overlap.CONCURRENT)
    for i in range(2):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    first, withdrawn = claims.claim(process, now, 2)
    marks = starts.StartMarks()
    assert marks.mark(first, lambda: ([withdrawn], 1))
    marks.forget([withdrawn])
    assert not marks._done


@pytest.mark.crash
@pytest.mark.processes
def test_a_killed_process_s_unstarted_runs_run_again_and_its_started_ones_follow_policy(
    postgres, children
):
    """At most once: a run claimed ahead of its plan time, not started when its process was
    SIGKILLed, runs once on another process; a run whose job was running fails."""
    quick = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1, "PLAN_AHEAD": 30}
    at_most_once = {"allow_stale_reentry": False, "lease_timeout": timedelta(seconds=3)}
    now = clock.now()
    ahead = ScheduleFactory(
        job="tests.jobs.record", interval=None, run_at=now + timedelta(seconds=8), **at_most_once
    )
    running = ScheduleFactory(job="tests.jobs.linger", kwargs={"seconds": 60}, **at_most_once)
    running.run_now()

    doomed = children.start("--workers", "2", settings=quick)
    claimed_ahead = Lease.objects.filter(run__schedule=ahead, started_at__isnull=True)
    job_running = Execution.objects.filter(schedule=running.name)
    wait_for(lambda: claimed_ahead.exists() and job_running.exists(), 30, "both claims")
    doomed.kill()

    heir = children.start("--workers", "2", settings=quick)
    ended = Run.objects.filter(status__in=Run.FINAL_STATUSES)
    wait_for(lambda: ended.count() == 2, 60, "both runs to end")
    assert heir.terminate() == 0
    ahead_run, running_run = Run.objects.get(schedule=ahead), Run.objects.get(schedule=running)
    assert (ahead_run.status, ahead_run.error_code) == ("succeeded", "")
    assert Execution.objects.filter(schedule=ahead.name).count() == 1
    assert (running_run.status, running_run.error_code) == ("failed", "lease_expired")
    assert job_running.count() == 1


@pytest.mark.django_db
def test_claims_marked_ahead_find_their_mark_done_and_a_lost_one_is_refused(process, now, written):
    schedule = ScheduleFactory(overlap=Schedule.Overlap.CONCURRENT)
    for i in range(3):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    kept, other, lost = claims.claim(process, now, 3)
    Lease.objects.filter(token=lost.token).update(released_at=now)  # lost meanwhile
    marks = starts.StartMarks()
    marks.mark_ahead([kept, other, lost])
    assert [marks.mark(claim) for claim in (kept, other, lost)] == [True, True, False]
    assert written == [3]  # one statement for all, none when their threads came
    assert set(Lease.objects.filter(started_at__isnull=False).values_list("token", flat=True)) == {
        kept.token,
        other.token,
    }


@pytest.mark.django_db(transaction=True)
def test_a_held_burst_is_marked_in_one_statement_before_its_jobs_are_called(process, now, written):
    schedule = ScheduleFactory(job="tests.jobs.record", overlap=Schedule.Overlap.CONCURRENT)
    plan_time = clock.now() + timedelta(seconds=1)
    for i in range(3):
        RunFactory(schedule=schedule, plan_time=plan_time, exclusive=False, scope=f"k{i}")
    claimed = claims.claim(process, None, 3, ahead=timedelta(minutes=1))
    done = threading.Semaphore(0)
    recorder = Recorder()
    pool = WorkerPool(3, on_done=done.release, recorder=recorder)
    try:
        for claim in claimed:
            pool.submit(claim)
        for _ in claimed:
            assert done.acquire(timeout=30)
        assert recorder.flush(timeout=10)
    finally:
        pool.stop()
        recorder.stop()
    assert written == [3]  # by the holder, before the release; no thread wrote one
    (marked_at,) = set(Lease.objects.values_list("started_at", flat=True))  # one statement
    executed_at = Execution.objects.values_list("executed_at", flat=True)
    assert len(executed_at) == 3
    assert marked_at is not None and all(marked_at <= executed for executed in executed_at)
