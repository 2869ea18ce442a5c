"""A cron schedule's declared DST choice: for the spring-forward gap, skip or run at the
first valid instant; for the fall-back repeat, run once or both. Empty: cron(8)'s rule."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic.db import clock
from django_periodic.engine.planning import planner
from django_periodic.models import Run, Schedule
from django_periodic.timing import dst, triggers
from django_periodic.timing.triggers import CronTrigger, InvalidTrigger, fire_times
from tests.factories import ScheduleFactory
from tests.helpers import affected_changes, set_cursor, utc

BERLIN = "Europe/Berlin"  # 2026: 02:00 -> 03:00 on 29 March, 03:00 -> 02:00 on 25 October
SPRING, FALL = date(2026, 3, 29), date(2026, 10, 25)


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


# -- the 30- and 45-minute zones, on their actual change days --------------------------------

LORD_HOWE = "Australia/Lord_Howe"  # +10:30 / +11:00: a 30-minute change at 02:00 local
CHATHAM = "Pacific/Chatham"  # +12:45 / +13:45: a one-hour change at 02:45 local


def sunday(year: int, month: int, last: bool = False) -> date:
    """The first (or last) Sunday of a month."""
    day = date(year, month, 1) if not last else date(year, month + 1, 1) - timedelta(days=1)
    step = timedelta(days=-1 if last else 1)
    while day.weekday() != 6:
        day += step
    return day


# By the zones' current rules, for a year: the day of the gap, its first skipped wall time
# and length; the day of the repeat, its first repeated wall time and length.
CHANGES = {
    LORD_HOWE: lambda y: ((sunday(y, 10), time(2, 0), 30), (sunday(y, 4), time(1, 30), 30)),
    CHATHAM: lambda y: (
        (sunday(y, 9, last=True), time(2, 45), 60),
        (sunday(y, 4), time(2, 45), 60),
    ),
}
WINDOW = timedelta(hours=3)


def expected_fires(zone: str, matches, change: datetime, once: bool) -> set[datetime]:
    """The oracle, minute by minute: every instant near ``change`` whose wall time matches
    (a skipped wall time is never one: the gap's instants are not run), keeping only the
    first pass of a repeat when ``once``."""
    tz, found = ZoneInfo(zone), set()
    instant = change - WINDOW
    while instant < change + WINDOW:
        wall = instant.astimezone(tz)
        if matches(wall) and not (once and wall.fold):
            found.add(instant)
        instant += timedelta(minutes=1)
    return found


def fires_near(trigger: CronTrigger, change: datetime) -> list[datetime]:
    start = change - WINDOW - timedelta(microseconds=1)
    return [f for f in fire_times(trigger, 30, start) if f < change + WINDOW]


def shape(wall: datetime, hourly: bool):
    """A fixed-time daily job at ``wall``, or an hourly (wildcard) one at its minute, and
    how to tell a wall time it matches."""
    if hourly:
        return f"{wall.minute} * * * *", lambda w: w.minute == wall.minute
    return (
        f"{wall.minute} {wall.hour} * * *",
        lambda w: (w.hour, w.minute) == (wall.hour, wall.minute),
    )


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from([LORD_HOWE, CHATHAM]),
    year=st.integers(2026, 2040),
    minutes=st.integers(0, 59),
    hourly=st.booleans(),
    gap=st.sampled_from(["", "skip", "first_valid"]),
)
def test_in_the_gap_of_a_30_or_45_minute_zone_each_choice_is_applied(
    zone, year, minutes, hourly, gap
):
    (day, first, length), _ = CHANGES[zone](year)
    wall = datetime.combine(day, first) + timedelta(minutes=minutes % length)
    tz = ZoneInfo(zone)
    before, after = (wall.replace(tzinfo=tz, fold=f).utcoffset() for f in (0, 1))
    assert after - before == timedelta(minutes=length)  # the wall time is in the gap
    change = (datetime.combine(day, first) - before).replace(tzinfo=UTC)  # first valid instant
    expression, matches = shape(wall, hourly)
    trigger = CronTrigger(expression, zone, dst_gap=gap)
    fires = fires_near(trigger, change)
    rule = gap or ("skip" if hourly else "first_valid")  # cron(8): by the job's shape
    expected = expected_fires(zone, matches, change, once=False)
    if rule == "skip":
        assert set(fires) == expected  # nothing in the wall time's place
        if not hourly:
            assert not [f for f in fires if f.astimezone(tz).date() == day]
    else:
        assert change in fires  # at the first instant after the gap
        assert set(fires) == expected | {change}
    assert fires == sorted(set(fires))


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from([LORD_HOWE, CHATHAM]),
    year=st.integers(2026, 2040),
    minutes=st.integers(0, 59),
    hourly=st.booleans(),
    repeat=st.sampled_from(["", "once", "both"]),
)
def test_in_the_repeat_of_a_30_or_45_minute_zone_each_choice_is_applied(
    zone, year, minutes, hourly, repeat
):
    _, (day, first, length) = CHANGES[zone](year)
    wall = datetime.combine(day, first) + timedelta(minutes=minutes % length)
    tz = ZoneInfo(zone)
    before, after = (wall.replace(tzinfo=tz, fold=f).utcoffset() for f in (0, 1))
    assert before - after == timedelta(minutes=length)  # the wall time is repeated
    change = (datetime.combine(day, first) - after).replace(tzinfo=UTC)  # the clock goes back
    expression, matches = shape(wall, hourly)
    trigger = CronTrigger(expression, zone, dst_repeat=repeat)
    fires = fires_near(trigger, change)
    rule = repeat or ("both" if hourly else "once")  # cron(8): by the job's shape
    passes = [f for f in fires if f.astimezone(tz).replace(tzinfo=None) == wall]
    first_pass, second_pass = (
        (wall - before).replace(tzinfo=UTC),
        (wall - after).replace(tzinfo=UTC),
    )
    if rule == "once":
        assert passes == [first_pass]  # one fire for the repeated wall time: the first
    else:
        assert passes == [first_pass, second_pass]  # two, in real time
    assert set(fires) == expected_fires(zone, matches, change, once=rule == "once")
    assert fires == sorted(set(fires))


def test_the_changes_of_the_30_and_45_minute_zones_are_found_with_their_rule_applied():
    howe = CronTrigger("15 2 * * *", LORD_HOWE, dst_gap="skip")
    (change,) = affected_changes(howe, utc(2026, 9, 1), utc(2026, 12, 1))
    assert change.change.at == utc(2026, 10, 3, 15, 30)  # 02:00 +10:30 becomes 02:30 +11
    assert (change.walls, change.rule, change.declared) == (
        (datetime(2026, 10, 4, 2, 15),),
        "skip",
        True,
    )
    assert change.fires == ()
    chatham = CronTrigger("50 2 * * *", CHATHAM, dst_repeat="both")
    fall, spring = affected_changes(chatham, utc(2026, 1, 1), utc(2027, 1, 1))
    assert fall.change.at == utc(2026, 4, 4, 14, 0)  # 03:45 +13:45 becomes 02:45 +12:45
    assert fall.fires == (utc(2026, 4, 4, 13, 5), utc(2026, 4, 4, 14, 5))  # 02:50 twice
    assert (spring.rule, spring.declared) == ("first_valid", False)  # cron(8)'s, for a fixed time
    assert spring.fires == (utc(2026, 9, 26, 14, 0),)  # 03:45 +13:45, right after the gap


def test_a_fire_of_its_own_at_the_change_is_not_taken_for_the_gaps():
    # 02:00 does not exist on 29 March; 03:00, right after the change, is a fire of its own.
    hourly = CronTrigger("0 * * * *", BERLIN)  # a wildcard job: cron(8) skips the gap
    (spring,) = affected_changes(hourly, utc(2026, 3, 1), utc(2026, 4, 1))
    assert (spring.walls, spring.rule, spring.fires) == ((datetime(2026, 3, 29, 2, 0),), "skip", ())
    assert utc(2026, 3, 29, 1, 0) in fire_times(hourly, 5, utc(2026, 3, 28, 23, 30))
    moved = CronTrigger("0 * * * *", BERLIN, dst_gap="first_valid")
    (spring,) = affected_changes(moved, utc(2026, 3, 1), utc(2026, 4, 1))
    assert spring.fires == (utc(2026, 3, 29, 1, 0),)  # one fire: 02:00's and 03:00's


def test_a_zone_without_changes_has_none_and_the_scan_finds_each_of_berlins():
    assert (
        affected_changes(CronTrigger("30 2 * * *", "UTC"), utc(2026, 1, 1), utc(2028, 1, 1)) == []
    )
    changes = dst.offset_changes(ZoneInfo(BERLIN), utc(2026, 1, 1), utc(2028, 1, 1))
    assert [c.at for c in changes] == [
        utc(2026, 3, 29, 1),
        utc(2026, 10, 25, 1),
        utc(2027, 3, 28, 1),
        utc(2027, 10, 31, 1),
    ]


# -- planning across Berlin's changes, on the database ---------------------------------------


def plan_each_fire(schedule: Schedule, cursor: datetime, fires: int) -> list[datetime]:
    """Plan the schedule at each of its next ``fires`` fire times from ``cursor``, as a
    scheduler awake at each would; the plan times of its runs."""
    set_cursor(schedule, cursor)
    for _ in range(fires):
        schedule.refresh_from_db()
        planner.plan_due(schedule.next_fire_at)
    return list(
        Run.objects.filter(schedule=schedule)
        .order_by("plan_time")
        .values_list("plan_time", flat=True)
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("gap", "planned"),
    [
        ("skip", [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30)]),  # none on the 29th
        ("first_valid", [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]),
    ],
)
def test_the_planner_applies_the_gap_choice_across_berlins_spring_forward(gap, planned):
    schedule = ScheduleFactory(cron="30 2 * * *", interval=None, timezone=BERLIN, dst_gap=gap,
                               overlap="concurrent")  # fmt: skip
    assert plan_each_fire(schedule, utc(2026, 3, 28, 1, 30), len(planned)) == planned


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("repeat", "on_the_day"),
    [
        ("both", [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)]),
        ("once", [utc(2026, 10, 25, 0, 30)]),
    ],
)
def test_the_planner_applies_the_repeat_choice_across_berlins_fall_back(repeat, on_the_day):
    schedule = ScheduleFactory(cron="30 2 * * *", interval=None, timezone=BERLIN,
                               dst_repeat=repeat, overlap="concurrent")  # fmt: skip
    planned = plan_each_fire(schedule, utc(2026, 10, 24, 0, 30), len(on_the_day) + 2)
    assert planned == [utc(2026, 10, 24, 0, 30), *on_the_day, utc(2026, 10, 26, 1, 30)]
