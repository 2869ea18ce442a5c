"""Overlap, queue, start deadlines and cancellation in the ledger (one process, real database)."""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from django_periodic.engine import overlap
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims, leases, retries
from django_periodic.models import Run, Schedule
from tests import ledger
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import fire, set_cursor
from tests.threads import Thread

GRACE = timedelta(seconds=30)


def statuses(schedule: Schedule) -> list[tuple[str, str]]:
    runs = Run.objects.filter(schedule=schedule).order_by("plan_time", "pk")
    return [(run.status, run.error_code) for run in runs]


def every_second(**fields) -> Schedule:
    return ScheduleFactory(interval=timedelta(seconds=1), misfire_grace=GRACE, **fields)


@pytest.mark.django_db
def test_queue_holds_up_to_max_queued_fires_and_skips_the_rest(now):
    schedule = every_second(overlap="queue", max_queued=2)
    for second in range(4):
        fire(schedule, now + timedelta(seconds=second))
    assert statuses(schedule) == [
        ("pending", ""),
        ("queued", ""),
        ("queued", ""),
        ("skipped", "queue_full"),
    ]


@pytest.mark.django_db
def test_concurrent_runs_are_capped_by_max_concurrent(now):
    schedule = every_second(overlap="concurrent", max_concurrent=2)
    for second in range(3):
        fire(schedule, now + timedelta(seconds=second))
    assert statuses(schedule) == [("pending", ""), ("pending", ""), ("skipped", "overlap")]
    assert not Run.objects.filter(schedule=schedule, status="pending", exclusive=True).exists()


@pytest.mark.django_db
def test_an_unknown_overlap_value_acts_as_skip(now):
    schedule = every_second()
    Schedule.objects.filter(pk=schedule.pk).update(overlap="bogus")
    schedule.refresh_from_db()
    for second in range(2):
        fire(schedule, now + timedelta(seconds=second))
    assert statuses(schedule) == [("pending", ""), ("skipped", "overlap")]


@pytest.mark.django_db
def test_the_database_refuses_a_second_active_run_of_a_schedule(now):
    schedule = every_second()
    RunFactory(schedule=schedule, plan_time=now, status="running")
    with pytest.raises(IntegrityError), transaction.atomic():
        RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=1), status="pending")
    # Concurrent schedules are not exclusive: both may be active.
    other = every_second(overlap="concurrent")
    RunFactory(schedule=other, plan_time=now, status="running", exclusive=False)
    RunFactory(schedule=other, plan_time=now + timedelta(seconds=1), exclusive=False)


@pytest.mark.django_db
def test_a_pending_fire_must_start_within_its_misfire_grace(now):
    schedule = every_second()
    late = now - timedelta(seconds=5)
    fire(schedule, late)
    run = Run.objects.get(schedule=schedule)
    assert run.start_deadline == now - timedelta(seconds=5) + GRACE
    assert claims.skip_late(run.start_deadline, "default") == []  # not yet: deadline is inclusive
    assert len(claims.skip_late(run.start_deadline + timedelta(microseconds=1))) == 1
    assert statuses(schedule) == [("skipped", "start_deadline")]


@pytest.mark.django_db
def test_a_fire_made_late_by_the_misfire_policy_gets_a_fresh_grace(now):
    schedule = every_second(misfire="latest")
    Schedule.objects.filter(pk=schedule.pk).update(misfire_grace=timedelta(seconds=1))
    schedule.refresh_from_db()
    set_cursor(schedule, now - timedelta(seconds=3))
    planner.plan_due(now)
    fired = Run.objects.get(schedule=schedule, status="pending")
    assert fired.start_deadline == now + timedelta(seconds=1)


@pytest.mark.django_db
def test_claim_skips_late_runs_and_promotes_the_queue_behind_them(process, now):
    schedule = every_second(overlap="queue")
    fire(schedule, now - timedelta(minutes=5))
    fire(schedule, now - timedelta(minutes=5) + timedelta(seconds=1))
    assert statuses(schedule) == [("pending", ""), ("queued", "")]
    (claim,) = claims.claim(process, now, 1)
    assert statuses(schedule) == [("skipped", "start_deadline"), ("running", "")]
    assert claim.run.plan_time == now - timedelta(minutes=5) + timedelta(seconds=1)


@pytest.mark.django_db
def test_a_retried_run_is_not_skipped_by_its_start_deadline(process, now):
    run = RunFactory(plan_time=now, start_deadline=now, status="pending", attempt=1)
    assert claims.skip_late(now + timedelta(minutes=1)) == []
    assert Run.objects.get(pk=run.pk).status == "pending"


@pytest.mark.django_db
def test_the_next_queued_run_starts_when_the_active_one_ends(process, now):
    schedule = every_second(overlap="queue")
    fire(schedule, now)
    fire(schedule, now + timedelta(seconds=1))
    (claim,) = claims.claim(process, now, 5)
    assert claims.claim(process, now, 5) == []  # the queued run waits
    ledger.succeed(claim, now, None)
    assert statuses(schedule) == [("succeeded", ""), ("pending", "")]


@pytest.mark.django_db
def test_the_sweeper_promotes_a_queued_run_left_without_an_active_one(now):
    schedule = every_second(overlap="queue")
    RunFactory(schedule=schedule, plan_time=now, status="queued")
    RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=1), status="queued")
    assert overlap.promote_queued("default", None) == 1
    assert statuses(schedule) == [("pending", ""), ("queued", "")]
    assert overlap.promote_queued("default", None) == 0  # one active run at a time


@pytest.mark.django_db
def test_a_manual_run_supersedes_a_run_waiting_to_retry(now):
    schedule = every_second(max_attempts=3)
    RunFactory(schedule=schedule, plan_time=now, status="retrying", attempt=1)
    manual = schedule.run_now()
    assert (manual.status, manual.trigger) == ("pending", "manual")
    assert statuses(schedule)[0] == ("failed", "superseded")


@pytest.mark.django_db
def test_run_now_follows_the_overlap_policy(now):
    schedule = every_second()
    RunFactory(schedule=schedule, plan_time=now, status="running")
    skipped = schedule.run_now()
    assert (skipped.status, skipped.error_code) == ("skipped", "overlap")
    assert skipped.finished_at is not None


@pytest.mark.django_db
def test_run_now_decides_on_the_locked_row_not_on_a_stale_copy(now):
    stale = every_second(job="tests.jobs.add", args=[1, 2])
    RunFactory(schedule=stale, plan_time=now, status="running", exclusive=False)
    Schedule.objects.filter(pk=stale.pk).update(overlap="concurrent", args=[3, 4])
    manual = stale.run_now()  # the copy in hand still says overlap "skip", args [1, 2]
    assert (manual.status, manual.exclusive, manual.args) == ("pending", False, [3, 4])


@pytest.mark.django_db
def test_plan_retry_repeats_a_failed_run_with_its_snapshot(now):
    schedule = every_second(job="tests.jobs.add", args=[1, 2])
    failed = RunFactory(schedule=schedule, plan_time=now, status="failed", args=[5, 6])
    retry = retries.plan_retry(failed, now + timedelta(minutes=1))
    assert (retry.trigger, retry.status, retry.plan_time) == ("retry", "pending", now)
    assert (retry.job_name, retry.args) == ("tests.jobs.add", [5, 6])


@pytest.mark.django_db
def test_cancel_ends_waiting_runs_and_asks_running_ones_to_stop(process, now):
    waiting = [RunFactory(plan_time=now, status=s) for s in ("pending", "retrying")]
    queued_schedule = every_second(overlap="queue")
    queued = RunFactory(schedule=queued_schedule, plan_time=now, status="queued")
    running = RunFactory(plan_time=now, status="running")
    done = RunFactory(plan_time=now, status="succeeded")
    ids = [run.pk for run in [*waiting, queued, running, done]]
    assert Run.objects.filter(pk__in=ids).cancel(now) == (3, 1)
    assert {r.pk: r.status for r in Run.objects.filter(pk__in=ids)} == {
        waiting[0].pk: "cancelled",
        waiting[1].pk: "cancelled",
        queued.pk: "cancelled",
        running.pk: "running",
        done.pk: "succeeded",
    }
    assert Run.objects.get(pk=running.pk).cancel_requested_at == now
    assert leases.request_cancel(Run.objects.filter(pk=running.pk), now) == (0, 0)


@pytest.mark.django_db
def test_cancelling_the_active_run_starts_the_queued_one(now):
    schedule = every_second(overlap="queue")
    active = RunFactory(schedule=schedule, plan_time=now, status="pending")
    RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=1), status="queued")
    leases.request_cancel(Run.objects.filter(pk=active.pk), now)
    assert statuses(schedule) == [("cancelled", "cancelled"), ("pending", "")]


@pytest.mark.django_db
def test_a_batch_the_database_refuses_is_planned_one_schedule_at_a_time(postgres, now):
    good, bad = every_second(), every_second()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE FUNCTION refuse_run() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused by test'; END $$;
            CREATE TRIGGER refuse_run BEFORE INSERT ON django_periodic_run
            FOR EACH ROW WHEN (NEW.schedule_id = {bad.pk:d}) EXECUTE FUNCTION refuse_run();
            """
        )
    Schedule.objects.update(next_fire_at=now)
    result = planner.plan_due(now)
    assert result.failed == [bad.name]
    assert statuses(good) == [("pending", "")]
    bad.refresh_from_db()
    assert "refused by test" in bad.last_error and bad.planning_failures == 1
    assert bad.next_fire_at == now  # not advanced: it fires once the row is fixed


@pytest.mark.django_db(transaction=True)
def test_concurrent_run_now_and_planning_start_one_run_of_a_skip_schedule(postgres):
    """Manual requests and planners racing on one schedule: one active run, the rest skipped."""
    schedule = every_second()
    barrier = threading.Barrier(6)

    def request(index: int) -> None:
        barrier.wait()
        if index % 2:
            Schedule.objects.get(pk=schedule.pk).run_now()
        else:
            planner.plan_due(schedule.next_fire_at + timedelta(seconds=index))

    threads = [Thread(target=request, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = Run.objects.filter(schedule=schedule)
    assert runs.filter(status="pending").count() == 1
    assert runs.filter(trigger="manual").count() == 3
    assert set(runs.exclude(status="pending").values_list("error_code", flat=True)) <= {
        "overlap",
        "missed",
    }
