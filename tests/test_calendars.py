"""Calendars and business days: closed fires are left out or shifted to an open day, the
planner records one skipped run per closed span, and a bad calendar fails only the
schedules that use it."""

import sys
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import holidays
import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import decisions, planner
from django_periodic.engine.records import Due
from django_periodic.models import Calendar, Run, Schedule
from django_periodic.policies import Occupancy
from django_periodic.testing import fire_times
from django_periodic.timing import business_days, triggers
from django_periodic.timing.business_days import CalendarRules, Closures
from django_periodic.timing.open_fires import OpenTrigger, PlanningTrigger
from tests.factories import ScheduleFactory, due_row

BERLIN = ZoneInfo("Europe/Berlin")
WEEKEND = frozenset({5, 6})
FRIDAY = datetime(2026, 3, 6, tzinfo=BERLIN)  # then Saturday 7th, Sunday 8th, Monday 9th
SECOND = timedelta(seconds=1)


def berlin(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN).astimezone(UTC)


def weekends(**fields) -> Closures:
    rules = CalendarRules("weekends", "Europe/Berlin", closed_weekdays=WEEKEND, **fields)
    return Closures((rules,))


def open_fires(cron: str, mode: str, start: datetime, end: datetime, closures=None):
    trigger = OpenTrigger(triggers.cron(cron, "Europe/Berlin"), closures or weekends(), mode)
    return fire_times(trigger, start, end)


# -- the trigger math, without the database ---------------------------------------------------


def test_skip_leaves_the_fires_of_closed_days_out():
    fires = open_fires("0 9 * * *", "skip", FRIDAY, FRIDAY + timedelta(days=4))
    assert fires == [berlin(2026, 3, 6, 9), berlin(2026, 3, 9, 9)]


def test_next_open_day_runs_the_first_of_the_month_on_the_monday_after():
    fires = open_fires("0 9 1 * *", "next_open_day", berlin(2026, 7, 1), berlin(2026, 9, 1))
    assert fires == [berlin(2026, 7, 1, 9), berlin(2026, 8, 3, 9)]  # Aug 1st: a Saturday


def test_previous_open_day_runs_the_first_of_the_month_on_the_friday_before():
    fires = open_fires("0 9 1 * *", "previous_open_day", berlin(2026, 7, 2), berlin(2026, 9, 1))
    assert fires == [berlin(2026, 7, 31, 9)]


def test_two_fires_shifted_onto_one_time_are_one_fire():
    fires = open_fires("0 9 * * *", "next_open_day", FRIDAY, FRIDAY + timedelta(days=4))
    # Saturday's and Sunday's fires move to Monday 09:00, where Monday's own is: one fire.
    assert fires == [berlin(2026, 3, 6, 9), berlin(2026, 3, 9, 9)]


def test_a_shift_keeps_the_time_of_day_across_a_dst_change():
    # Sunday 2026-03-29: Berlin goes from UTC+1 to UTC+2; Saturday's 09:00 runs Monday 09:00.
    fires = open_fires("0 9 28 3 *", "next_open_day", berlin(2026, 3, 27), berlin(2026, 4, 1))
    assert fires == [berlin(2026, 3, 30, 9)]
    assert fires[0].astimezone(BERLIN).hour == 9


def test_public_holidays_close_their_day_with_their_name():
    rules = CalendarRules("bavaria", "Europe/Berlin", "DE", "BY")
    closure = Closures((rules,)).closure(berlin(2026, 12, 25, 9))
    # The package's own name for it, in the language it picks ("Christmas Day" in English).
    name = holidays.country_holidays("DE", subdiv="BY", years=2026)[date(2026, 12, 25)]
    assert closure is not None and closure.reason == name
    assert Closures((rules,)).closure(berlin(2026, 12, 23, 9)) is None


def test_a_fire_in_a_blackout_is_not_run_even_when_shifting():
    freeze = business_days.Blackout(berlin(2026, 3, 9, 0), berlin(2026, 3, 10, 12), "freeze")
    closures = weekends(blackouts=(freeze,))
    fires = open_fires("0 9 * * *", "next_open_day", FRIDAY, FRIDAY + timedelta(days=6), closures)
    # The weekend's fires would move to Monday, which the freeze closes, so do Monday's and
    # Tuesday's own: none of them runs.
    assert fires == [berlin(2026, 3, 6, 9), berlin(2026, 3, 11, 9)]


def test_a_closed_day_in_a_blackout_is_not_shifted_out_of_it():
    freeze = business_days.Blackout(berlin(2026, 3, 7), berlin(2026, 3, 8), "freeze")
    closures = weekends(blackouts=(freeze,))
    fires = open_fires("0 9 * * *", "next_open_day", FRIDAY, FRIDAY + timedelta(days=4), closures)
    # Saturday is closed twice, the blackout first: not run. Sunday's fire moves to Monday.
    assert fires == [berlin(2026, 3, 6, 9), berlin(2026, 3, 9, 9)]
    closure = closures.closure(berlin(2026, 3, 7, 9))
    assert closure is not None and closure.blackout
    assert closure.reason == "blackout until 2026-03-07 23:00 UTC: freeze"


def test_skipping_a_per_second_weekend_jumps_over_it():
    every_second = triggers.IntervalTrigger(SECOND, berlin(2026, 1, 1))
    trigger = OpenTrigger(every_second, weekends(), "skip")
    friday_end = berlin(2026, 3, 7) - SECOND
    assert trigger.next_after(friday_end) == berlin(2026, 3, 9)  # 172,800 fires, two jumps
    assert trigger.latest_at_or_before(berlin(2026, 3, 8, 12)) == friday_end


def test_shifting_a_per_second_weekend_jumps_over_it_too():
    every_second = triggers.IntervalTrigger(SECOND, berlin(2026, 1, 1))
    trigger = OpenTrigger(every_second, weekends(), "next_open_day")
    # Saturday's and Sunday's 172,800 fires move onto Monday's own: none comes before them.
    assert trigger.next_after(berlin(2026, 3, 7)) == berlin(2026, 3, 9)
    assert trigger.latest_at_or_before(berlin(2026, 3, 8, 12)) == berlin(2026, 3, 7) - SECOND


def test_bad_calendar_values_are_refused_with_what_is_wrong():
    with pytest.raises(triggers.InvalidTrigger) as refused:
        CalendarRules.parse("bad", "Mars/Olympus", "", "", [7], ["2026-02-30"], [{"start": 1}])
    message = str(refused.value)
    assert "Calendar 'bad'" in message and "Mars/Olympus" in message
    assert "0 (Monday) to 6" in message and "2026-02-30" in message and "blackout" in message


def test_a_calendar_closed_every_weekday_is_refused():
    errors = dict(business_days.calendar_errors("UTC", "", "", list(range(7)), [], []))
    assert errors == {"closed_weekdays": "A calendar closed every weekday never opens."}


def test_an_unknown_on_closed_day_is_an_invalid_trigger():
    with pytest.raises(triggers.InvalidTrigger, match="on_closed_day"):
        OpenTrigger(triggers.cron("0 9 * * *"), weekends(), "tomorrow")


_closed_days = st.sets(st.integers(0, 6), max_size=4)
_dates = st.sets(st.dates(date(2026, 1, 1), date(2026, 12, 31)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    weekdays=_closed_days,
    dates=_dates,
    mode=st.sampled_from(["skip", "next_open_day", "previous_open_day"]),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Asia/Kolkata", "UTC"]),
    hour=st.integers(0, 23),
    monthly=st.booleans(),
)
def test_open_fires_are_the_shifted_fires_in_order_and_found_both_ways(
    weekdays, dates, mode, zone, hour, monthly
):
    """Against brute force: every fire shifted by ``shifted()``, deduplicated, in order;
    ``latest_at_or_before`` finds each again, and the planner's walk visits each once."""
    rules = CalendarRules("c", zone, closed_weekdays=frozenset(weekdays), closed_dates=dates)
    inner = triggers.cron(f"30 {hour} {'1' if monthly else '*'} * *", zone)
    trigger = OpenTrigger(inner, Closures((rules,)), mode)
    start, end = datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    nominal = fire_times(inner, start - timedelta(days=10), end + timedelta(days=10))
    expected = sorted(
        {moved for f in nominal if (moved := trigger.shifted(f)) and start <= moved < end}
    )
    assert fire_times(trigger, start, end) == expected
    for before, fire in zip([None, *expected], expected, strict=False):
        assert trigger.latest_at_or_before(fire) == fire
        if before is not None:
            assert trigger.latest_at_or_before(fire - timedelta(microseconds=1)) == before
    walk, at = [], start - timedelta(microseconds=1)
    planning = PlanningTrigger(trigger)
    while (at := planning.next_after(at)) is not None and at < end:
        walk.append(at)
    assert [t for t in walk if planning.closure(t) is None] == expected
    assert all(inner.latest_at_or_before(t) == t for t in walk if planning.closure(t))


# -- deciding, without the database -----------------------------------------------------------


def weekend_row(**columns) -> Due:
    """A schedule every second, due at Saturday 00:00 Berlin, closed on weekends."""
    weekend = {
        "interval": SECOND,
        "next_fire_at": berlin(2026, 3, 7),
        "on_closed_day": "skip",
        "has_calendars": True,
        "closures": weekends(),
    }
    return due_row(berlin(2026, 1, 1), **(weekend | columns))


def test_a_closed_weekend_of_a_per_second_schedule_is_one_skipped_run():
    row = weekend_row()
    decision = decisions.decide(row, berlin(2026, 3, 7, 0, 0, 30), Occupancy())
    (fire,) = decision.fires
    assert (fire.plan_time, fire.status, fire.error_code) == (
        berlin(2026, 3, 7),
        "skipped",
        ErrorCode.CLOSED,
    )
    assert fire.error_message == (
        "Closed by calendar 'weekends' (closed on Saturdays): its fires in it are not run."
    )
    assert decision.cursor == berlin(2026, 3, 9)


def test_a_bad_calendar_fails_its_schedule_alone():
    bad = weekend_row(pk=2, closures=None, calendar_error="Calendar 'x': bad zone.")
    good = weekend_row(has_calendars=False, closures=None, next_fire_at=berlin(2026, 3, 6, 12))
    found = decisions.decide_all([bad, good], berlin(2026, 3, 6, 12), {})
    assert found[0].error == "Cannot plan: Calendar 'x': bad zone."
    assert [fire.status for fire in found[1].fires] == ["pending"]


# -- the model and the planner -------------------------------------------------------------------


def weekend_calendar(**fields) -> Calendar:
    values = {"name": "weekends", "timezone": "Europe/Berlin", "closed_weekdays": [5, 6]}
    return Calendar.objects.create(**(values | fields))


@pytest.mark.django_db
def test_next_fire_times_and_fire_times_leave_closed_fires_out():
    schedule = ScheduleFactory(cron="0 9 1 * *", timezone="Europe/Berlin", interval=None)
    schedule.calendars.add(weekend_calendar())
    schedule.on_closed_day = "next_open_day"
    schedule.save()
    after = berlin(2026, 7, 2)
    assert schedule.next_fire_times(2, after=after) == [
        berlin(2026, 8, 3, 9),
        berlin(2026, 9, 1, 9),
    ]
    assert fire_times(schedule, after, berlin(2026, 9, 1)) == [berlin(2026, 8, 3, 9)]


@pytest.mark.django_db(transaction=True)
def test_the_planner_skips_a_closed_span_once_and_runs_the_open_day():
    now = clock.now()
    schedule = ScheduleFactory(interval=SECOND, start_at=now - timedelta(days=30))
    schedule.calendars.add(weekend_calendar(closed_weekdays=[0, 1, 2, 3, 4, 5, 6][:6]))
    # Closed Monday to Saturday: whatever today is, find the next Sunday-to-Monday change.
    Schedule.objects.filter(pk=schedule.pk).reschedule(now)
    schedule.refresh_from_db()
    first = schedule.next_fire_at
    planner.plan_due(first)
    runs = list(Run.objects.filter(schedule=schedule).values_list("status", "error_code"))
    if runs == [("skipped", ErrorCode.CLOSED)]:  # now is in the closed days: one row
        schedule.refresh_from_db()
        assert schedule.next_fire_at.astimezone(BERLIN).weekday() == 6  # Sunday, open
        assert schedule.next_fire_at.astimezone(BERLIN).time() == datetime.min.time()
    else:  # now is on Sunday: it runs
        assert runs == [("pending", "")]


@pytest.mark.django_db(transaction=True)
def test_previous_open_day_fires_each_shifted_fire_once_walking_day_by_day():
    schedule = ScheduleFactory(
        cron="0 9 * * *",
        timezone="Europe/Berlin",
        interval=None,
        on_closed_day="previous_open_day",
        overlap="concurrent",  # no worker runs them: each fire is its own pending run
    )
    schedule.calendars.add(weekend_calendar())
    Schedule.objects.filter(pk=schedule.pk).reschedule(berlin(2026, 3, 4, 12))
    for hours in range(0, 24 * 7 + 6, 6):  # a planner every six hours, Wednesday to Wednesday
        planner.plan_due(berlin(2026, 3, 4, 12) + timedelta(hours=hours))
    runs = Run.objects.filter(schedule=schedule).order_by("plan_time")
    found = [(run.plan_time.astimezone(BERLIN).day, run.status) for run in runs]
    # Thursday, Friday (the weekend's fires moved onto Friday 09:00: one run), the weekend's
    # closed span (one skipped run, at Saturday 09:00), Monday, Tuesday, Wednesday.
    assert [day for day, _ in found] == [5, 6, 7, 9, 10, 11]
    assert [status for _, status in found].count("skipped") == 1
    assert runs.get(plan_time=berlin(2026, 3, 7, 9)).error_code == ErrorCode.CLOSED


@pytest.mark.django_db(transaction=True)
def test_calendars_cost_as_many_queries_for_one_schedule_as_for_many():
    calendar = weekend_calendar()

    def plan(count: int) -> int:
        Schedule.objects.all().delete()
        for index in range(count):
            schedule = ScheduleFactory(name=f"s{index}", cron="0 9 * * *", interval=None)
            schedule.calendars.add(calendar)
        Schedule.objects.update(next_fire_at=berlin(2026, 3, 6, 9))
        with CaptureQueriesContext(connection) as queries:
            planner.plan_due(berlin(2026, 3, 6, 9))
        assert Run.objects.filter(plan_time=berlin(2026, 3, 6, 9)).count() == count
        Run.objects.all().delete()
        return len(queries)

    assert plan(1) == plan(6)


@pytest.mark.django_db(transaction=True)
def test_a_calendar_stored_bad_through_update_fails_only_its_schedules():
    calendar = weekend_calendar()
    with_it = ScheduleFactory(name="with", cron="0 9 * * *", interval=None)
    with_it.calendars.add(calendar)
    without = ScheduleFactory(name="without", cron="0 9 * * *", interval=None)
    Calendar.objects.filter(pk=calendar.pk).update(timezone="Mars/Olympus", closed_dates="x")
    Schedule.objects.update(next_fire_at=berlin(2026, 3, 6, 9))
    result = planner.plan_due(berlin(2026, 3, 6, 9))
    assert result.failed == ["with"]
    with_it.refresh_from_db()
    assert "Mars/Olympus" in with_it.last_error
    assert Run.objects.get().schedule_id == without.pk


@pytest.mark.django_db
def test_clean_refuses_bad_calendar_values_on_their_fields():
    calendar = Calendar(
        name="bad", timezone="Nowhere", closed_weekdays=[9], closed_dates=["soon"],
        blackouts=[{"start": "2026-01-02T00:00+00:00", "end": "2026-01-01T00:00+00:00"}],
    )  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        calendar.full_clean()
    assert set(refused.value.message_dict) == {
        "timezone",
        "closed_weekdays",
        "closed_dates",
        "blackouts",
    }
    assert "not after its start" in refused.value.message_dict["blackouts"][0]


@pytest.mark.django_db
def test_clean_refuses_an_unknown_country_and_subdivision():
    calendar = Calendar(name="c", timezone="UTC", holidays_country="XX")
    with pytest.raises(ValidationError, match="Unknown holidays country 'XX'"):
        calendar.full_clean()
    calendar.holidays_country, calendar.holidays_subdivision = "DE", "ZZ"
    with pytest.raises(ValidationError, match="Unknown subdivision 'ZZ' of DE"):
        calendar.full_clean()


def test_without_the_holidays_package_a_country_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "holidays", None)  # what an absent package imports as
    business_days._supported_countries.cache_clear()
    try:
        message = business_days.holidays_error("DE", "")
    finally:
        business_days._supported_countries.cache_clear()
    assert message == (
        "Country 'DE': public holidays need the holidays package: "
        "pip install django-periodic[holidays]."
    )


@pytest.mark.django_db
def test_saving_a_calendar_plans_its_schedules_again():
    schedule = ScheduleFactory(cron="0 9 * * *", timezone="Europe/Berlin", interval=None)
    calendar = weekend_calendar(closed_weekdays=[])
    schedule.calendars.add(calendar)
    schedule.refresh_from_db()
    calendar.closed_weekdays = list(range(6))  # only Sundays open now
    calendar.save()
    schedule.refresh_from_db()
    assert schedule.next_fire_at.astimezone(BERLIN).weekday() in (5, 6)  # Saturday's closed
    # span start, or Sunday


@pytest.mark.django_db
def test_the_check_names_each_calendar_with_a_country_when_holidays_is_missing(monkeypatch):
    from django_periodic import checks

    weekend_calendar(holidays_country="DE")
    monkeypatch.setitem(sys.modules, "holidays", None)  # what an absent package imports as
    business_days._supported_countries.cache_clear()
    try:
        errors = checks.check_holidays_installed(databases=["default"])
    finally:
        business_days._supported_countries.cache_clear()
    assert [error.id for error in errors] == ["django_periodic.E008"]
    assert "'weekends' names a country" in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_a_backfill_records_the_fires_that_would_have_run():
    schedule = ScheduleFactory(
        cron="0 9 * * *", timezone="Europe/Berlin", interval=None, on_closed_day="next_open_day"
    )
    schedule.calendars.add(weekend_calendar())
    result = schedule.backfill(berlin(2026, 3, 6), berlin(2026, 3, 10), rate=1000)
    assert result.recorded == 2
    plan_times = Run.objects.filter(schedule=schedule).values_list("plan_time", flat=True)
    assert sorted(plan_times) == [berlin(2026, 3, 6, 9), berlin(2026, 3, 9, 9)]


@pytest.mark.django_db(transaction=True)
def test_an_unknown_on_closed_day_stored_through_update_fails_only_its_schedule():
    with_it = ScheduleFactory(name="with", cron="0 9 * * *", interval=None)
    with_it.calendars.add(weekend_calendar())
    ScheduleFactory(name="without", cron="0 9 * * *", interval=None)
    Schedule.objects.filter(pk=with_it.pk).update(on_closed_day="tomorrow")
    Schedule.objects.update(next_fire_at=berlin(2026, 3, 6, 9))
    result = planner.plan_due(berlin(2026, 3, 6, 9))
    assert result.failed == ["with"]
    with_it.refresh_from_db()
    assert "Unknown on_closed_day 'tomorrow'" in with_it.last_error
