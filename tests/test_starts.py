"""The ledger knows, before a job is called, that it started; a crash re-enters the rest."""

import threading
from datetime import timedelta

import pytest

from django_periodic.db import clock
from django_periodic.engine.loop import workers
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.loop.workers import WorkerPool
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import claims, leases, starts
from django_periodic.models import Lease, Run, Schedule
from tests.factories import RunFactory, ScheduleFactory
from tests.models import Execution
from tests.processes import wait_for


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


def started() -> set:
    """The tokens of the leases marked started (the ledger's column, read back)."""
    return set(Lease.objects.filter(started_at__isnull=False).values_list("token", flat=True))


def claim_runs(process, now, count: int) -> list[Claim]:
    schedule = ScheduleFactory(overlap=Schedule.Overlap.CONCURRENT)
    for i in range(count):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    return claims.claim(process, now, count)


@pytest.mark.django_db(transaction=True)
def test_no_more_than_the_limit_is_ever_marked_ahead_of_the_threads(process, now, written):
    """A thread's claim is marked before it is taken, but at most ``limit`` claims wait
    marked: after a kill, no more than that were marked without their job being called."""
    expected = claim_runs(process, now, 6)
    marks = starts.StartMarks(lambda round_trip: 2)
    try:
        marks.expect(expected)
        for taken, claim in enumerate(expected, start=1):
            assert marks.mark(claim)
            assert claim.token in started()
            assert len(started()) <= taken + 2
        wait_for(lambda: len(started()) == 6, 30, "every claim marked")
    finally:
        marks.stop()
    assert max(written) <= 2 and sum(written) == 6


@pytest.mark.django_db(transaction=True)
def test_claims_expected_together_share_one_statement_and_a_lost_one_is_refused(
    process, now, written
):
    kept, other, lost = claim_runs(process, now, 3)
    Lease.objects.filter(token=lost.token).update(released_at=now)  # lost meanwhile
    marks = starts.StartMarks(lambda round_trip: 3)
    try:
        marks.expect([kept, other, lost])
        assert [marks.mark(claim) for claim in (kept, other, lost)] == [True, True, False]
    finally:
        marks.stop()
    assert written == [3]
    assert started() == {kept.token, other.token}


@pytest.mark.django_db(transaction=True)
def test_a_withdrawn_claim_marked_ahead_gives_its_place_to_the_next(process, now):
    withdrawn, following = claim_runs(process, now, 2)
    marks = starts.StartMarks(lambda round_trip: 1)
    try:
        marks.expect([withdrawn, following])
        wait_for(lambda: started() == {withdrawn.token}, 30, "the first claim marked")
        marks.forget([withdrawn])
        # No thread waits for it: it is marked because the withdrawn one left its place.
        wait_for(lambda: following.token in started(), 30, "the next claim marked")
    finally:
        marks.stop()


@pytest.mark.django_db(transaction=True)
def test_a_thread_waiting_for_its_mark_is_refused_once_marks_stop(process, now, monkeypatch):
    (claim,) = claim_runs(process, now, 1)
    marks = starts.StartMarks(lambda round_trip: 1)
    marks.stop()
    assert marks.mark(claim) is False
    assert not started()


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
    pool._note_duration(0.001)  # short jobs: their marks are written ahead
    try:
        for claim in claimed:
            pool.submit(claim)
        for _ in claimed:
            assert done.acquire(timeout=30)
        assert recorder.flush(timeout=10)
    finally:
        pool.stop()
        recorder.stop()
    assert written == [3]  # handed over by the holder before the release: one statement
    (marked_at,) = set(Lease.objects.values_list("started_at", flat=True))  # one statement
    executed_at = Execution.objects.values_list("executed_at", flat=True)
    assert len(executed_at) == 3
    assert marked_at is not None and all(marked_at <= executed for executed in executed_at)


@pytest.mark.django_db(transaction=True)
def test_runs_waiting_behind_threads_busy_with_long_jobs_are_not_marked(process, now, written):
    """Two threads busy with jobs not yet timed (long, until one ends), four runs waiting:
    none of those is marked until a thread takes it."""
    schedule = ScheduleFactory(
        job="tests.jobs.linger", kwargs={"seconds": 30}, overlap=Schedule.Overlap.CONCURRENT
    )
    for i in range(6):
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=i), exclusive=False)
    claimed = claims.claim(process, now, 6)
    done = threading.Semaphore(0)
    recorder = Recorder()
    pool = WorkerPool(2, on_done=done.release, recorder=recorder)
    try:
        for claim in claimed:
            pool.submit(claim)
        wait_for(lambda: Execution.objects.count() == 2, 30, "two jobs running")
        assert set(pool.withdraw_unstarted()) == set(claimed[2:])
        pool.stop_all(StopRequest.CANCEL)  # the lingering jobs return
        for _ in claimed:
            assert done.acquire(timeout=30)
    finally:
        pool.stop()
        recorder.stop()
    assert started() == {claim.token for claim in claimed[:2]}
    assert max(written) <= 2
    assert Execution.objects.count() == 2


def test_runs_are_marked_ahead_by_what_the_threads_call_in_a_short_time():
    recorder = Recorder()
    pool = WorkerPool(8, on_done=lambda: None, recorder=recorder)
    try:
        assert pool._marks_ahead(0.001) == 0  # no job timed yet: only when taken
        pool._note_duration(0.002)
        ahead = 8 * workers.MARK_AHEAD_TIME / 0.002  # what the threads call meanwhile
        assert pool._marks_ahead(0.001) == pytest.approx(8 + ahead, abs=1)
        slow = 2 * workers.MARK_AHEAD_TIME
        assert pool._marks_ahead(slow) == pytest.approx(8 + 2 * ahead, abs=1)  # its round trip's
        assert pool._marks_ahead(10.0) == 8 + workers.MARK_AHEAD_LIMIT
        pool._note_duration(0.5)  # one slow job among short ones: still short, typically
        assert pool._marks_ahead(0.001) > 8
        for _ in range(20):
            pool._note_duration(0.5)  # long jobs now
        assert pool._marks_ahead(0.001) == 0
    finally:
        pool.stop()
        recorder.stop()
