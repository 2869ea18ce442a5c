from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from django_periodic.models import Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import nested_lists, set_cursor

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def errors_of(**fields) -> dict[str, list[str]]:
    values = {"name": "s", "job": "tests.jobs.noop", "interval": timedelta(minutes=1)}
    values.update(fields)
    with pytest.raises(ValidationError) as caught:
        Schedule(**values).full_clean()
    return caught.value.message_dict


@pytest.mark.django_db
def test_a_second_schedule_of_the_same_name_is_refused_on_its_name_field():
    ScheduleFactory(name="s")
    assert errors_of(name="s") == {"name": ["Schedule with this Name already exists."]}
    with pytest.raises(IntegrityError), transaction.atomic():
        ScheduleFactory(name="s")


@pytest.mark.django_db
def test_a_valid_schedule_passes_full_clean():
    Schedule(name="s", job="tests.jobs.add", args=[1, 2], cron="0 3 * * *").full_clean()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field", "fragment"),
    [
        ({"interval": None, "cron": "61 * * * *"}, "cron", "minute"),
        ({"interval": None, "cron": "* * * * * *"}, "cron", "5 fields"),
        ({"timezone": "Mars/Olympus"}, "timezone", "Mars/Olympus"),
        ({"interval": timedelta(0)}, "interval", "positive"),
        ({"interval": None}, "cron", "exactly one trigger"),
        ({"cron": "* * * * *"}, "cron", "exactly one trigger"),
        ({"start_at": T0, "end_at": T0}, "end_at", "after start_at"),
        ({"args": {"a": 1}}, "args", "JSON list"),
        ({"kwargs": [1]}, "kwargs", "JSON object"),
        ({"job": "nowhere.job"}, "job", "nowhere.job"),
        ({"job": "tests.jobs.add", "args": [1]}, "args", "do not fit"),
        ({"args": [float("nan")]}, "args", "args cannot hold NaN: JSON has no NaN or infinity."),
        ({"args": [1e400]}, "args", "args cannot hold Infinity"),
        ({"kwargs": {"a": {"b": -1e400}}}, "kwargs", "kwargs cannot hold -Infinity"),
        ({"args": nested_lists(33)}, "args", "cannot nest lists and objects more than 32 levels"),
        ({"kwargs": {"a": nested_lists(500)}}, "kwargs", "more than 32 levels deep"),
        ({"lease_timeout": timedelta(0)}, "lease_timeout", "positive"),
        ({"lease_timeout": timedelta(seconds=15)}, "lease_timeout", "twice the heartbeat"),
        ({"misfire_grace": timedelta(seconds=-1)}, "misfire_grace", "negative"),
        ({"max_attempts": 0}, "max_attempts", "at least 1"),
    ],
)
def test_full_clean_rejects_bad_input_on_the_right_field(fields, field, fragment):
    messages = errors_of(**fields)
    assert field in messages, messages
    assert fragment in " ".join(messages[field])


@pytest.mark.django_db
def test_arguments_nested_32_deep_are_valid_and_saved():
    schedule = Schedule(name="s", job="tests.jobs.noop", args=nested_lists(32), cron="0 3 * * *")
    schedule.full_clean()
    schedule.save()
    schedule.refresh_from_db()
    assert schedule.args == nested_lists(32)


@pytest.mark.django_db
def test_saving_a_new_schedule_sets_its_cursor_to_the_first_fire(now):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *", timezone="Europe/Berlin")
    assert schedule.next_fire_at == schedule.next_fire_times(1, after=now)[0]


@pytest.mark.django_db
def test_an_interval_without_start_fires_one_interval_after_creation():
    schedule = ScheduleFactory(interval=timedelta(minutes=5))
    assert schedule.next_fire_at == schedule.created_at + timedelta(minutes=5)


@pytest.mark.django_db
def test_an_interval_is_anchored_at_start_at(now):
    start = now + timedelta(hours=1)
    schedule = ScheduleFactory(interval=timedelta(minutes=5), start_at=start)
    assert schedule.next_fire_at == start
    assert schedule.next_fire_times(3, after=start) == [
        start + timedelta(minutes=m) for m in (5, 10, 15)
    ]


@pytest.mark.django_db
def test_a_past_one_shot_stays_due_rather_than_vanishing():
    schedule = ScheduleFactory(interval=None, run_at=datetime(2020, 1, 1, tzinfo=UTC))
    assert schedule.next_fire_at == datetime(2020, 1, 1, tzinfo=UTC)


@pytest.mark.django_db
def test_changing_the_trigger_moves_the_cursor_but_other_edits_do_not(now):
    schedule = ScheduleFactory(interval=timedelta(minutes=5))
    set_cursor(schedule, T0)
    schedule.refresh_from_db()
    schedule.max_attempts = 3
    schedule.save()
    assert schedule.next_fire_at == T0
    schedule.interval = timedelta(hours=1)
    schedule.save()
    assert now < schedule.next_fire_at <= now + timedelta(hours=1, seconds=5)


@pytest.mark.django_db
def test_pausing_keeps_the_cursor_and_resuming_restarts_from_now(now):
    schedule = ScheduleFactory(interval=None, cron="*/5 * * * *")
    set_cursor(schedule, T0)
    schedule.refresh_from_db()
    schedule.enabled = False
    schedule.save()
    assert schedule.next_fire_at == T0
    schedule.enabled = True
    schedule.save()
    assert now < schedule.next_fire_at <= now + timedelta(minutes=5)


@pytest.mark.django_db
def test_a_fired_one_shot_does_not_fire_again_when_paused_and_resumed():
    schedule = ScheduleFactory(interval=None, run_at=T0)
    set_cursor(schedule, None)  # it has fired
    schedule.refresh_from_db()
    for enabled in (False, True):
        schedule.enabled = enabled
        schedule.save()
        assert schedule.next_fire_at is None
    Schedule.objects.filter(pk=schedule.pk).reschedule()
    schedule.refresh_from_db()
    assert schedule.next_fire_at is None
    schedule.run_at = T0 + timedelta(days=1)
    schedule.save()
    assert schedule.next_fire_at == T0 + timedelta(days=1)


@pytest.mark.django_db
def test_reschedule_recomputes_cursors_after_a_bulk_update(now):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *")
    Schedule.objects.filter(pk=schedule.pk).update(cron="0 4 * * *")
    Schedule.objects.filter(pk=schedule.pk).reschedule()
    schedule.refresh_from_db()
    assert schedule.next_fire_at.hour == 4


@pytest.mark.django_db
def test_next_fire_times_are_aware_utc_and_increasing():
    schedule = ScheduleFactory(interval=None, cron="30 2 * * *", timezone="Europe/Berlin")
    times = schedule.next_fire_times(5, after=datetime(2026, 10, 23, tzinfo=UTC))
    assert all(t.tzinfo == UTC for t in times)
    assert times == sorted(set(times))
    assert times[2] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, once
    assert times[3] == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)  # 02:30 CET


@pytest.mark.django_db
def test_run_now_respects_the_overlap_policy():
    schedule = ScheduleFactory()
    RunFactory(schedule=schedule, status="running")
    run = schedule.run_now()
    assert (run.status, run.error_code) == ("skipped", "overlap")


@pytest.mark.django_db
def test_run_querysets_are_named_after_states():
    RunFactory(status="failed")
    RunFactory(status="running")
    RunFactory(status="succeeded")
    assert Run.objects.failed().count() == 1
    assert Run.objects.running().count() == 1
    assert Run.objects.active().count() == 1


@pytest.mark.django_db
def test_a_schedule_stored_without_save_is_unplanned_until_rescheduled(now):
    Schedule.objects.bulk_create([Schedule(name="s", job="tests.jobs.noop", cron="0 3 * * *")])
    schedule = Schedule.objects.get()
    assert schedule.is_unplanned
    Schedule.objects.reschedule(now)
    schedule.refresh_from_db()
    assert not schedule.is_unplanned
    assert schedule.next_fire_at == schedule.first_fire_time(now)


@pytest.mark.django_db
def test_alive_and_stale_processes_are_one_rule_in_sql_and_in_python():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    edge = now - SchedulerProcess.stale_after()
    silences = [timedelta(0), timedelta(microseconds=-1), timedelta(microseconds=1)]
    processes = [SchedulerProcessFactory(heartbeat_at=edge + s, started_at=edge) for s in silences]
    alive = set(SchedulerProcess.objects.alive(now))
    stale = set(SchedulerProcess.objects.stale(now))
    assert alive == {processes[0], processes[2]} and stale == {processes[1]}
    assert [p.alive_at(now) for p in processes] == [True, False, True]
