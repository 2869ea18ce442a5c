"""Stagger (Schedule.jitter): a run starts at its plan time plus a fixed offset in
[0, jitter); the ledger key stays the plan time."""

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from django_periodic.db import clock
from django_periodic.engine.loop.scheduler import look_ahead
from django_periodic.engine.runs import claims
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.operations import health
from django_periodic.timing import stagger
from tests import jobs
from tests.factories import ScheduleFactory, SchedulerProcessFactory
from tests.helpers import fire, set_cursor
from tests.processes import wait_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JITTER = timedelta(minutes=10)


def offsets(count: int) -> list[timedelta]:
    return [stagger.offset(JITTER, 1, f"tenant-{n}", T0) for n in range(count)]


def test_an_offset_is_fixed_by_schedule_scope_and_plan_time_and_within_the_jitter():
    first = offsets(1000)
    assert offsets(1000) == first
    assert all(timedelta(0) <= offset < JITTER for offset in first)
    assert stagger.offset(JITTER, 2, "tenant-0", T0) != first[0]
    assert stagger.offset(JITTER, 1, "tenant-0", T0 + timedelta(days=1)) != first[0]
    assert stagger.offset(None, 1, "", T0) == stagger.offset(timedelta(0), 1, "", T0)
    assert stagger.release_time(None, 1, "", T0) is None


def test_ten_thousand_tenants_spread_evenly_over_the_jitter():
    per_minute = Counter(offset // timedelta(minutes=1) for offset in offsets(10_000))
    assert sorted(per_minute) == list(range(10))
    # 1,000 a minute expected; a hash is within a few percent (31 is one deviation).
    assert all(900 <= count <= 1100 for count in per_minute.values()), per_minute


@pytest.mark.django_db
def test_jitter_is_validated_against_its_range_and_the_interval():
    schedule = ScheduleFactory.build(job="tests.jobs.noop", interval=timedelta(minutes=5))
    schedule.jitter = timedelta(minutes=5)
    with pytest.raises(ValidationError) as error:
        schedule.full_clean()
    assert "jitter must be shorter than the interval" in str(error.value)
    schedule.jitter = timedelta(days=2)
    with pytest.raises(ValidationError) as error:
        schedule.full_clean()
    assert "jitter" in error.value.message_dict


@pytest.mark.django_db
def test_the_database_refuses_a_jitter_out_of_range_written_by_update():
    schedule = ScheduleFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(jitter=timedelta(days=2))


@pytest.mark.django_db
def test_a_fire_records_its_release_and_a_deadline_counted_from_it(monkeypatch):
    monkeypatch.setattr(jobs, "TENANTS", [f"tenant-{n}" for n in range(50)])
    staggered = ScheduleFactory(
        job="tests.jobs.per_tenant", scopes="tests.jobs.tenants", jitter=JITTER, start_at=T0
    )
    plain = ScheduleFactory(start_at=T0)
    for schedule in (staggered, plain):
        set_cursor(schedule, T0)
    fire(staggered, T0)
    fire(plain, T0)
    runs = Run.objects.filter(schedule=staggered)
    assert runs.count() == 50
    grace = staggered.misfire_grace
    for run in runs:
        assert run.plan_time == T0  # the ledger's key
        assert run.release_at == T0 + stagger.offset(JITTER, staggered.pk, run.scope, T0)
        assert run.start_deadline == run.release_at + grace
        assert staggered.release_time(T0, run.scope) == run.release_at  # what users ask
    assert len({run.release_at for run in runs}) > 40  # spread, not one time
    plain_run = Run.objects.get(schedule=plain)
    assert plain_run.release_at is None and plain_run.release_time == T0
    assert plain.release_time(T0) == T0


@pytest.fixture
def process(db) -> SchedulerProcess:
    return SchedulerProcessFactory()


def claimed_ids(process: SchedulerProcess, now: datetime, **kwargs) -> set[int]:
    return {claim.run.pk for claim in claims.claim(process, now, 100, **kwargs)}


@pytest.mark.django_db
def test_a_run_is_claimed_at_its_release_not_at_its_plan_time(process):
    schedule = ScheduleFactory(jitter=timedelta(seconds=50), interval=timedelta(minutes=1))
    set_cursor(schedule, T0)
    fire(schedule, T0)
    run = Run.objects.get(schedule=schedule)
    release = run.release_time
    assert release > T0 + timedelta(seconds=1)  # this schedule's offset is not tiny
    before = release - timedelta(microseconds=1)
    assert not Run.objects.claimable(before).exists()
    assert claimed_ids(process, before) == set()
    looked = look_ahead()
    assert looked.next_pending == release
    assert set(Run.objects.claimable(release)) == {run}
    assert claimed_ids(process, release) == {run.pk}
    run.refresh_from_db()
    assert run.started_at == release


@pytest.mark.django_db
def test_a_run_claimed_ahead_is_held_until_its_release(process):
    schedule = ScheduleFactory(jitter=timedelta(seconds=50), interval=timedelta(minutes=1))
    set_cursor(schedule, T0)
    fire(schedule, T0)
    run = Run.objects.get(schedule=schedule)
    now = T0 - timedelta(seconds=1)
    ahead = run.release_time - now + timedelta(seconds=1)
    assert set(Run.objects.coming(now, ahead)) == {run}
    (claim,) = claims.claim(process, now, 10, ahead=ahead)
    wait = claim.starts_at() - claim.claimed_at
    assert wait == pytest.approx((run.release_time - now).total_seconds(), abs=1e-6)


@pytest.mark.django_db
def test_a_task_worker_claims_a_staggered_run_only_once_released():
    schedule = ScheduleFactory(jitter=timedelta(seconds=50), interval=timedelta(minutes=1))
    set_cursor(schedule, T0)
    fire(schedule, T0)
    run = Run.objects.get(schedule=schedule)
    assert claims.claim_run(run.pk, "worker", now=T0) is None
    assert claims.claim_run(run.pk, "worker", now=run.release_time) is not None


@pytest.mark.django_db
def test_lag_is_measured_from_the_release():
    schedule = ScheduleFactory(jitter=timedelta(minutes=5))
    now = clock.now()
    release = now - timedelta(seconds=10)
    Run.objects.create(
        schedule=schedule,
        plan_time=release - timedelta(minutes=4),
        release_at=release,
        status=Run.Status.SUCCEEDED,
        attempt=1,
        started_at=release + timedelta(seconds=2),
        job_name=schedule.job,
    )
    lag = health.fire_lag(now)
    assert lag.runs == 1
    assert lag.p50 == timedelta(seconds=2)


@pytest.mark.processes
def test_a_scheduler_starts_each_scope_at_its_own_release(children):
    """A real run_scheduler: three tenants of one fire start at three releases, none
    before its own (claimed ahead, held until then)."""
    child = children.start("--workers", "3", settings={"PLAN_AHEAD": 3})
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    schedule = ScheduleFactory(
        job="tests.jobs.per_tenant",
        scopes="tests.jobs.tenants",
        interval=timedelta(hours=1),
        start_at=start,
        end_at=start,
        jitter=timedelta(seconds=3),
    )
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    wait_for(lambda: done.count() == 3, 30, "three succeeded runs")
    assert child.terminate() == 0
    for run in done:
        assert run.plan_time == start
        assert run.release_at == start + stagger.offset(
            schedule.jitter, schedule.pk, run.scope, start
        )
        assert run.started_at >= run.release_at  # held until its release, never early
