"""A schedule's lifecycle (docs/policies.md, "Lifecycle"): it ends after ``max_runs`` fires,
fires once when created or enabled again (``fire_on_create``) and pauses itself after
``pause_after_failures`` failed runs in a row."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from django_periodic import registry, signals
from django_periodic.choices import Misfire, Overlap, RunStatus, RunTrigger
from django_periodic.db import clock
from django_periodic.engine.planning import attention, code_schedules, planner
from django_periodic.models import Run, Schedule, pausing
from tests import jobs
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import fire, set_cursor
from tests.models import Execution
from tests.processes import run_until_it_pauses_itself, wait_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


def every_minute(**fields) -> Schedule:
    """An every-minute schedule from T0, due at T0; its runs may overlap (unless ``fields``
    say otherwise), so that each fire runs whatever became of the last."""
    fields = {"overlap": Overlap.CONCURRENT, **fields}
    schedule = ScheduleFactory(interval=MINUTE, start_at=T0, **fields)
    set_cursor(schedule, T0)
    schedule.refresh_from_db()
    return schedule


def planned_times(schedule: Schedule) -> list[datetime]:
    """The plan times of its fires recorded to run, in order."""
    runs = Run.objects.filter(schedule=schedule, trigger=RunTrigger.SCHEDULE)
    runs = runs.exclude(status=RunStatus.SKIPPED).order_by("plan_time")
    return list(runs.values_list("plan_time", flat=True))


# max_runs


@pytest.mark.django_db
def test_max_runs_stops_after_exactly_that_many_fires_when_misfire_all_catches_up():
    """Ten fires due at once, all run (misfire ``all``, overlap ``concurrent``), max_runs 3:
    the first three fire, the rest are not recorded, and the schedule has no next fire."""
    schedule = every_minute(max_runs=3, misfire=Misfire.ALL, misfire_grace=MINUTE)
    planner.plan_due(T0 + 10 * MINUTE)
    assert planned_times(schedule) == [T0, T0 + MINUTE, T0 + 2 * MINUTE]
    assert not Run.objects.filter(schedule=schedule, plan_time__gt=T0 + 2 * MINUTE).exists()
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (3, None)
    assert schedule.has_ended and schedule.runs_note == "ended: ran 3 of 3 runs"
    assert planner.plan_due(T0 + 100 * MINUTE).fired == 0
    assert len(planned_times(schedule)) == 3


@pytest.mark.django_db
def test_each_fire_counts_once_until_the_last_ends_it():
    schedule = every_minute(max_runs=2)
    fire(schedule, T0)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (1, T0 + MINUTE)
    assert schedule.runs_note == "1 of 2 runs"
    fire(schedule, T0 + MINUTE)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (2, None)


@pytest.mark.django_db
def test_a_schedule_without_max_runs_counts_its_fires_and_goes_on():
    schedule = every_minute()
    for n in range(3):
        fire(schedule, T0 + n * MINUTE)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (3, T0 + 3 * MINUTE)
    assert schedule.runs_note == "3 run(s)" and not schedule.has_ended


@pytest.mark.django_db
def test_a_fire_skipped_for_an_overlap_does_not_count():
    schedule = every_minute(max_runs=2, overlap=Overlap.SKIP)
    RunFactory(schedule=schedule, plan_time=T0 - MINUTE, status=RunStatus.RUNNING)
    fire(schedule, T0)
    (skipped,) = Run.objects.filter(schedule=schedule, plan_time=T0)
    assert skipped.status == RunStatus.SKIPPED
    schedule.refresh_from_db()
    assert schedule.fire_count == 0


@pytest.mark.django_db
def test_a_fanned_out_fire_counts_once_however_many_scopes():
    schedule = every_minute(job="tests.jobs.per_tenant", scopes="tests.jobs.tenants", max_runs=2)
    fire(schedule, T0)
    fire(schedule, T0 + MINUTE)
    assert Run.objects.filter(schedule=schedule).count() == 2 * len(jobs.TENANTS)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (2, None)
    fire(schedule, T0 + 2 * MINUTE)
    assert Run.objects.filter(schedule=schedule).count() == 2 * len(jobs.TENANTS)


@pytest.mark.django_db
def test_manual_runs_and_backfills_do_not_count():
    schedule = every_minute(max_runs=1)
    schedule.run_now()
    schedule.backfill(T0 - 5 * MINUTE, T0)
    schedule.refresh_from_db()
    assert schedule.fire_count == 0
    fire(schedule, T0)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (1, None)


@pytest.mark.django_db
def test_raising_max_runs_resumes_an_ended_schedule_from_now():
    schedule = every_minute(max_runs=1)
    fire(schedule, T0)
    schedule.refresh_from_db()
    assert schedule.next_fire_at is None
    schedule.max_runs = 3
    schedule.save()
    schedule.refresh_from_db()
    assert schedule.next_fire_at is not None and not schedule.has_ended
    fire(schedule, T0 + MINUTE)
    fire(schedule, T0 + 2 * MINUTE)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (3, None)
    assert planned_times(schedule) == [T0, T0 + MINUTE, T0 + 2 * MINUTE]


@pytest.mark.django_db
def test_clearing_max_runs_resumes_and_lowering_it_to_the_count_ends():
    schedule = every_minute(max_runs=5)
    fire(schedule, T0)
    fire(schedule, T0 + MINUTE)
    schedule.refresh_from_db()
    schedule.max_runs = 2
    schedule.save()
    assert schedule.next_fire_at is None and schedule.has_ended
    schedule.max_runs = None
    schedule.save()
    assert schedule.next_fire_at is not None


@pytest.mark.django_db
def test_a_schedule_ended_without_save_records_nothing_more():
    """max_runs lowered by update() below the count: the planner ends it when due."""
    schedule = every_minute(max_runs=5)
    fire(schedule, T0)
    Schedule.objects.filter(pk=schedule.pk).update(max_runs=1)
    assert fire(schedule, T0 + MINUTE).fired == 0
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (1, None)


def test_max_runs_needs_a_repeating_trigger_and_a_range():
    one_shot = Schedule(name="once", job="tests.jobs.noop", run_at=T0, max_runs=2)
    with pytest.raises(ValidationError) as raised:
        one_shot.clean()
    assert "max_runs" in raised.value.message_dict
    zero = Schedule(name="zero", job="tests.jobs.noop", interval=MINUTE, max_runs=0)
    with pytest.raises(ValidationError) as raised:
        zero.clean()
    assert "max_runs" in raised.value.message_dict


# fire_on_create


def manual_runs(schedule: Schedule) -> int:
    return Run.objects.filter(schedule=schedule, trigger=RunTrigger.MANUAL).count()


@pytest.mark.django_db
def test_fire_on_create_fires_a_new_schedule_once_and_never_on_later_saves():
    schedule = ScheduleFactory(fire_on_create=True, interval=timedelta(hours=1))
    (run,) = Run.objects.filter(schedule=schedule)
    assert (run.trigger, run.status) == (RunTrigger.MANUAL, RunStatus.PENDING)
    schedule.interval = timedelta(hours=2)
    schedule.save()
    schedule.enabled = True
    schedule.save(update_fields=["enabled"])
    assert manual_runs(schedule) == 1
    schedule.refresh_from_db()
    assert schedule.fire_count == 0 and schedule.next_fire_at > run.plan_time


@pytest.mark.django_db
def test_fire_on_create_fires_again_when_enabled_again():
    schedule = ScheduleFactory(fire_on_create=True)
    schedule.enabled = False
    schedule.save()
    assert manual_runs(schedule) == 1
    Run.objects.filter(schedule=schedule).update(status=RunStatus.SUCCEEDED)
    schedule.enabled = True
    schedule.save(update_fields=["enabled", "updated_at"])
    assert manual_runs(schedule) == 2


@pytest.mark.django_db
def test_a_schedule_created_disabled_or_without_fire_on_create_does_not_fire():
    off = ScheduleFactory(fire_on_create=True, enabled=False)
    plain = ScheduleFactory()
    assert not Run.objects.filter(schedule__in=[off, plain]).exists()


@pytest.mark.django_db
def test_a_code_schedule_fires_on_creation_by_the_first_sync_only(clean_registry):
    registry.job(name="warm_cache", cron="@daily", fire_on_create=True)(lambda: None)
    assert code_schedules.sync_code_schedules().created == ["warm_cache"]
    code_schedules.sync_code_schedules()  # a scheduler's start: the row exists
    schedule = Schedule.objects.get(name="warm_cache")
    assert manual_runs(schedule) == 1


# pause_after_failures


@pytest.fixture
def paused_signals():
    """The schedule_paused signals sent, as (schedule, by, until, reason)."""
    sent = []

    def receiver(sender, schedule, by, until, reason, **kwargs):
        sent.append((schedule, by, until, reason))

    signals.schedule_paused.connect(receiver)
    yield sent
    signals.schedule_paused.disconnect(receiver)


def paused_by(now: datetime) -> list:
    """The schedules an evaluation (as the scheduler's housekeeping makes) paused."""
    return attention.evaluate(now).paused


def runs_ending(schedule: Schedule, statuses: str, now: datetime) -> list[Run]:
    """Runs of ``schedule`` a second apart after ``now``, one per letter: F failed, S
    succeeded."""
    status = {"F": RunStatus.FAILED, "S": RunStatus.SUCCEEDED}
    return [
        RunFactory(schedule=schedule, plan_time=now + (n + 1) * SECOND, status=status[letter])
        for n, letter in enumerate(statuses)
    ]


@pytest.mark.django_db(transaction=True)
def test_a_schedule_pauses_itself_after_exactly_n_failures_in_a_row(paused_signals):
    now = clock.now()
    schedule = ScheduleFactory(pause_after_failures=3)
    first, second = runs_ending(schedule, "FF", now)
    assert paused_by(now) == []
    (third,) = runs_ending(schedule, "F", now + 2 * SECOND)
    (paused,) = paused_by(now)
    assert paused.schedule_id == schedule.pk
    schedule.refresh_from_db()
    assert schedule.paused_until == pausing.UNTIL_RESUMED and schedule.paused_by == "scheduler"
    assert schedule.is_paused(now + timedelta(days=365 * 100))
    for run in (first, second, third):
        assert f"run {run.pk} planned" in schedule.pause_reason
    assert schedule.pause_reason.startswith("3 failed runs in a row")
    assert paused_signals == [
        (schedule.name, "scheduler", pausing.UNTIL_RESUMED, schedule.pause_reason)
    ]
    assert attention.evaluate(now).watched == 0  # paused: judged no more
    assert len(paused_signals) == 1
    version = schedule.versions.first()  # the newest: the pause, by the scheduler
    assert (version.by, version.revision) == ("scheduler", schedule.revision)
    assert version.changes["paused_by"] == ["", "scheduler"]
    assert version.changes["pause_reason"] == ["", schedule.pause_reason]


@pytest.mark.django_db
def test_a_success_in_between_ends_the_streak():
    now = clock.now()
    schedule = ScheduleFactory(pause_after_failures=3)
    runs_ending(schedule, "FFSFF", now)
    assert paused_by(now) == []
    schedule.refresh_from_db()
    assert schedule.paused_until is None


@pytest.mark.django_db
def test_a_resumed_schedule_gets_its_threshold_afresh():
    now = clock.now()
    schedule = ScheduleFactory(pause_after_failures=2)
    Schedule.objects.filter(pk=schedule.pk).update(updated_at=now - timedelta(hours=1))
    runs_ending(schedule, "FF", now - timedelta(minutes=1))  # before the resume below
    assert len(paused_by(now)) == 1
    schedule.refresh_from_db()
    schedule.resume()
    assert paused_by(clock.now()) == []
    later = clock.now()
    runs_ending(schedule, "FF", later)
    assert len(paused_by(later)) == 1


@pytest.mark.django_db
def test_a_disabled_schedule_or_one_without_the_field_does_not_pause():
    now = clock.now()
    off = ScheduleFactory(pause_after_failures=1, enabled=False)
    plain = ScheduleFactory()
    for schedule in (off, plain):
        runs_ending(schedule, "FFF", now)
    assert paused_by(now) == []
    assert Schedule.objects.filter(paused_until__isnull=False).count() == 0


@pytest.mark.django_db
def test_a_schedule_paused_for_its_failures_skips_its_fires_until_resumed():
    now = clock.now()
    schedule = every_minute(pause_after_failures=1)
    runs_ending(schedule, "F", now)
    paused_by(now)
    later = now + timedelta(hours=1)
    fire(schedule, later)
    (skipped,) = Run.objects.filter(schedule=schedule, plan_time=later)
    assert skipped.status == RunStatus.SKIPPED
    assert skipped.error_message.startswith("Paused until resumed by scheduler: 1 failed run")


# a real scheduler


def executions(schedule: Schedule) -> int:
    """How many times the job of ``schedule`` ran, by the rows it wrote (tests.jobs.record)."""
    return Execution.objects.filter(schedule=schedule.name).count()


def wait_for_fires(clock_schedule: Schedule, n: int) -> None:
    """Wait until ``clock_schedule`` (every second, tests.jobs.record) has run ``n`` more
    times: a measure of the scheduler's progress that is no sleep."""
    target = executions(clock_schedule) + n
    wait_for(lambda: executions(clock_schedule) >= target, 30, f"{n} more fires")


@pytest.mark.processes
def test_a_running_scheduler_runs_a_job_exactly_max_runs_times(postgres, children):
    start = clock.now().replace(microsecond=0) + 2 * SECOND
    every_second = {"job": "tests.jobs.record", "interval": SECOND, "start_at": start}
    limited = ScheduleFactory(name="limited", max_runs=3, **every_second)
    ticking = ScheduleFactory(name="ticking", **every_second)
    child = children.start("--workers", "2")
    wait_for(lambda: executions(limited) >= 3, 30, "three runs of the limited schedule")
    wait_for_fires(ticking, 5)  # several further fires of its twin
    assert child.terminate() == 0
    assert executions(limited) == 3
    limited.refresh_from_db()
    assert (limited.fire_count, limited.next_fire_at) == (3, None)
    plan_times = Execution.objects.filter(schedule="limited").values_list("plan_time", flat=True)
    # Those it ran are those recorded to run; any missed while it started were skipped.
    assert sorted(plan_times) == planned_times(limited)


@pytest.mark.processes
def test_a_running_scheduler_pauses_a_failing_schedule_and_runs_it_no_more(postgres, children):
    seen = run_until_it_pauses_itself(
        children.start, workers=2, ticks=5, settings={"ALERT_INTERVAL": 1}
    )
    failing = seen.failing
    # The third failure's outcome pauses it (test_self_pausing.py says why exactly then).
    assert seen.ran_when_paused == executions(failing) == 3
    failing.refresh_from_db()
    assert failing.paused_until == pausing.UNTIL_RESUMED
    failed = Run.objects.filter(schedule=failing, status=RunStatus.FAILED)
    assert failed.count() == executions(failing)  # every call failed, every failure a call
    named = [
        pk for pk in failed.values_list("pk", flat=True) if f"run {pk} " in failing.pause_reason
    ]
    assert len(named) >= 3
    assert "Schedule 'failing' paused itself until resumed" in seen.child.output()
