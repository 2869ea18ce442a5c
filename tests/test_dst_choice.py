"""A cron schedule's declared DST choice: for the spring-forward gap, skip or run at the
first valid instant; for the fall-back repeat, run once or both. Empty: cron(8)'s rule."""

from datetime import UTC, date, datetime, time, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic import clock, triggers
from django_periodic.engine import planner
from django_periodic.models import Run, Schedule
from django_periodic.triggers import CronTrigger, InvalidTrigger, fire_times
from tests.factories import ScheduleFactory

BERLIN = "Europe/Berlin"  # 2026: 02:00 -> 03:00 on 29 March, 03:00 -> 02:00 on 25 October
SPRING, FALL = date(2026, 3, 29), date(2026, 10, 25)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def day_fires(trigger: CronTrigger, day: date) -> list[datetime]:
    """The fires of a local day in Berlin (UTC+1 before spring, +2 after; the days here)."""
    start = datetime.combine(day, time(0), tzinfo=UTC) - timedelta(hours=3)
    return [f for f in fire_times(trigger, 60, start) if f < start + timedelta(hours=27)]


def test_a_fixed_time_job_runs_at_the_change_by_default_and_may_skip_the_gap():
    default = CronTrigger("30 2 * * *", BERLIN)
    skip = CronTrigger("30 2 * * *", BERLIN, dst_gap="skip")
    assert utc(2026, 3, 29, 1, 0) in day_fires(default, SPRING)  # 03:00 CEST, the change
    assert not [f for f in day_fires(skip, SPRING) if f.date() == SPRING]
    assert skip.next_after(utc(2026, 3, 29, 0, 59)) == utc(2026, 3, 30, 0, 30)


def test_a_fixed_time_job_runs_once_in_the_repeat_by_default_and_may_run_both():
    default = CronTrigger("30 2 * * *", BERLIN)
    both = CronTrigger("30 2 * * *", BERLIN, dst_repeat="both")
    repeat = [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)]  # 02:30 CEST, then CET
    assert [f for f in day_fires(default, FALL) if f.date() == FALL] == repeat[:1]
    assert [f for f in day_fires(both, FALL) if f.date() == FALL] == repeat


def test_a_wildcard_job_skips_the_gap_by_default_and_may_run_at_the_first_valid_instant():
    default = CronTrigger("15 * * * *", BERLIN)  # the hour field starts with '*'
    first_valid = CronTrigger("15 * * * *", BERLIN, dst_gap="first_valid")
    change = utc(2026, 3, 29, 1, 0)  # 02:15 CET does not exist: 03:00 CEST instead
    assert change not in day_fires(default, SPRING)
    assert change in day_fires(first_valid, SPRING)
    assert len(day_fires(first_valid, SPRING)) == len(day_fires(default, SPRING)) + 1


def test_a_wildcard_job_runs_both_occurrences_by_default_and_may_run_once():
    default = CronTrigger("15 * * * *", BERLIN)
    once = CronTrigger("15 * * * *", BERLIN, dst_repeat="once")
    second = utc(2026, 10, 25, 1, 15)  # 02:15 CET, the repeat's second 02:15
    assert second in day_fires(default, FALL)
    assert second not in day_fires(once, FALL)
    assert utc(2026, 10, 25, 0, 15) in day_fires(once, FALL)


@settings(max_examples=60, deadline=None)
@given(
    expression=st.sampled_from(["30 2 * * *", "15 * * * *", "*/20 1-3 * * *", "0 */2 * * *"]),
    zone=st.sampled_from([BERLIN, "America/New_York", "Australia/Lord_Howe"]),
    gap=st.sampled_from(["", "skip", "first_valid"]),
    repeat=st.sampled_from(["", "once", "both"]),
    day=st.sampled_from([SPRING, FALL, date(2026, 3, 8), date(2026, 11, 1), date(2026, 4, 5)]),
)
def test_every_choice_gives_increasing_fires_that_the_trigger_finds_again(
    expression, zone, gap, repeat, day
):
    trigger = CronTrigger(expression, zone, dst_gap=gap, dst_repeat=repeat)
    start = datetime.combine(day, time(0), tzinfo=UTC) - timedelta(days=1)
    fires = fire_times(trigger, 80, start)
    assert fires == sorted(set(fires))  # strictly increasing: no plan time twice
    for fire in fires:
        assert trigger.latest_at_or_before(fire) == fire
        assert trigger.next_after(fire - timedelta(microseconds=1)) == fire


def test_an_unknown_choice_is_an_invalid_trigger():
    with pytest.raises(InvalidTrigger, match="dst_gap must be one of"):
        triggers.cron("30 2 * * *", BERLIN, dst_gap="later")


@pytest.mark.django_db
def test_the_schedule_builds_its_trigger_with_its_choice_and_only_a_cron_takes_one():
    schedule = Schedule(name="nightly", job="tests.jobs.noop", cron="30 2 * * *",
                        timezone=BERLIN, dst_gap="skip", dst_repeat="both")  # fmt: skip
    schedule.full_clean()
    cron = schedule.trigger.trigger
    assert (cron.dst_gap, cron.dst_repeat) == ("skip", "both")
    every = Schedule(name="every", job="tests.jobs.noop", interval=timedelta(hours=1),
                     dst_gap="skip")  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        every.full_clean()
    assert list(refused.value.message_dict) == ["dst_gap"]


@pytest.mark.django_db(transaction=True)
def test_an_absurd_choice_stored_past_clean_fails_its_schedule_alone(admin_client):
    now = clock.now()
    odd = ScheduleFactory(name="odd", cron="* * * * *", interval=None)
    fine = ScheduleFactory(name="fine", cron="* * * * *", interval=None)
    Schedule.objects.filter(pk=odd.pk).update(dst_gap="later", next_fire_at=now)
    Schedule.objects.filter(pk=fine.pk).update(next_fire_at=now)
    planner.plan_due(now)
    assert Run.objects.filter(schedule=fine).exists()
    assert not Run.objects.filter(schedule=odd).exists()
    assert "dst_gap must be one of" in Schedule.objects.get(pk=odd.pk).last_error
    page = admin_client.get(reverse("admin:django_periodic_schedule_changelist"))
    assert page.status_code == 200 and "odd" in page.text
