"""Calendars at their edges: fires found by stretches however often a trigger fires and
however many blackouts there are, the bounds on a calendar's size, and a trigger and its
calendars validated together on every path (the model, the admin, pause and resume)."""

import json
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ValidationError
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic.db import clock
from django_periodic.models import Calendar, Schedule
from django_periodic.testing import fire_times
from django_periodic.timing import triggers
from django_periodic.timing.business_days import (
    MAX_BLACKOUTS,
    MAX_CLOSED_DATES,
    MAX_SHIFT_DAYS,
    Blackout,
    CalendarRules,
    Closures,
)
from django_periodic.timing.open_fires import OpenTrigger, PlanningTrigger
from tests.factories import ScheduleFactory, schedule_form_data

BERLIN = ZoneInfo("Europe/Berlin")
MODES = ("skip", "next_open_day", "previous_open_day")
MICROSECOND = timedelta(microseconds=1)


def berlin(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN).astimezone(UTC)


# -- a brute-force oracle: every fire, every blackout, nothing skipped ----------------------


def oracle_closure(calendars, moment):
    """(blackout?, zone) of what closes ``moment``, by a linear scan, or None."""
    for rules in calendars:
        holding = [b for b in rules.blackouts if b.start <= moment < b.end]
        if holding:
            return True, rules.timezone
    for rules in calendars:
        day = moment.astimezone(ZoneInfo(rules.timezone)).date()
        if day in rules.closed_dates or day.weekday() in rules.closed_weekdays:
            return False, rules.timezone
    return None


def oracle_shifted(calendars, mode, fire):
    """Where ``fire`` runs, by the rules of docs/calendars.md, one day at a time."""
    closed = oracle_closure(calendars, fire)
    if closed is None:
        return fire
    blackout, zone_name = closed
    if blackout or mode == "skip":
        return None
    zone = ZoneInfo(zone_name)
    wall = fire.astimezone(zone).replace(tzinfo=None)
    step = timedelta(days=1 if mode == "next_open_day" else -1)
    for days in range(1, MAX_SHIFT_DAYS + 1):
        candidate = (wall + days * step).replace(tzinfo=zone, fold=0).astimezone(UTC)
        found = oracle_closure(calendars, candidate)
        if found is None:
            return candidate
        if found[0]:
            return None
    return None


def oracle_fires(inner, calendars, mode, start, end):
    margin = timedelta(days=MAX_SHIFT_DAYS + 2)
    nominal = fire_times(inner, start - margin, end + margin)
    moved = (oracle_shifted(calendars, mode, fire) for fire in nominal)
    return sorted({fire for fire in moved if fire is not None and start <= fire < end})


# Ten days around Europe's spring DST change (29 March 2026).
START, END = datetime(2026, 3, 24, tzinfo=UTC), datetime(2026, 4, 3, tzinfo=UTC)


@st.composite
def blackouts(draw, count: int):
    """``count`` blackouts in the window, from minutes to hours long, overlapping freely."""
    found = []
    for index in range(count):
        start = START - timedelta(days=10) + timedelta(minutes=draw(st.integers(0, 60 * 24 * 30)))
        length = timedelta(minutes=draw(st.sampled_from([3, 7, 45, 120, 600])))
        found.append(Blackout(start, start + length, f"b{index}"))
    return tuple(found)


@settings(max_examples=6, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    weekdays=st.sets(st.integers(0, 6), max_size=3),
    other_weekdays=st.sets(st.integers(0, 6), max_size=2),
    berlin_blackouts=blackouts(100),
    york_blackouts=blackouts(100),
    trigger=st.sampled_from(["*/20 * * * *", "7 */2 * * *", "interval"]),
)
def test_open_fires_match_a_brute_force_oracle_with_many_blackouts(
    mode, weekdays, other_weekdays, berlin_blackouts, york_blackouts, trigger
):
    """Two calendars in two zones, 200 overlapping blackouts, a dense trigger across DST
    change: the fires found by stretches are those found fire by fire; each is found
    again backwards, and the planner's walk visits each once."""
    calendars = (
        CalendarRules("a", "Europe/Berlin", closed_weekdays=frozenset(weekdays),
                      blackouts=berlin_blackouts),
        CalendarRules("b", "America/New_York", closed_weekdays=frozenset(other_weekdays),
                      blackouts=york_blackouts),
    )  # fmt: skip
    if trigger == "interval":
        inner = triggers.IntervalTrigger(timedelta(minutes=13, seconds=7), START)
    else:
        inner = triggers.cron(trigger, "Europe/Berlin")
    opened = OpenTrigger(inner, Closures(calendars), mode)
    expected = oracle_fires(inner, calendars, mode, START, END)
    assert fire_times(opened, START, END) == expected
    for before, fire in list(zip([None, *expected], expected, strict=False))[::5]:
        assert opened.latest_at_or_before(fire) == fire
        if before is not None:
            assert opened.latest_at_or_before(fire - MICROSECOND) == before
    planning, walk, at = PlanningTrigger(opened), [], START - MICROSECOND
    while (at := planning.next_after(at)) is not None and at < END:
        walk.append(at)
    assert [fire for fire in walk if planning.closure(fire) is None] == expected


@settings(max_examples=30, deadline=None)
@given(blackout_list=blackouts(400), moments=st.lists(st.integers(0, 60 * 24 * 60), max_size=40))
def test_a_blackout_is_found_by_bisection_as_by_a_scan(blackout_list, moments):
    """Of overlapping blackouts, the one that starts first (then ends first) closes."""
    rules = CalendarRules("c", "UTC", blackouts=blackout_list)
    for minutes in moments:
        moment = START - timedelta(days=10) + timedelta(minutes=minutes, seconds=30)
        holding = [b for b in blackout_list if b.start <= moment < b.end]
        closure = rules.blackout_closure(moment)
        if not holding:
            assert closure is None
            continue
        first = min(holding, key=lambda b: (b.start, b.end, b.reason))
        assert closure is not None and (closure.start, closure.end) == (first.start, first.end)
        assert closure.reason.endswith(f": {first.reason}")


def weekends_closed() -> Closures:
    return Closures((CalendarRules("weekends", "Europe/Berlin", closed_weekdays={5, 6}),))


@pytest.mark.parametrize("mode", MODES)
def test_a_per_minute_cron_under_closed_weekends_works_with_every_policy(mode):
    opened = OpenTrigger(triggers.cron("* * * * *", "Europe/Berlin"), weekends_closed(), mode)
    friday_evening = berlin(2026, 3, 6, 23, 58)
    # Saturday's first fire moves onto Monday's own (or Friday's, already past).
    assert opened.next_after(berlin(2026, 3, 6, 23, 59)) == berlin(2026, 3, 9)
    assert opened.latest_at_or_before(berlin(2026, 3, 8, 12)) == berlin(2026, 3, 6, 23, 59)
    # Friday's last minutes, then Monday's first: the weekend's fires run on Friday's (or
    # Monday's) minutes, which already have their own.
    assert fire_times(opened, friday_evening, berlin(2026, 3, 9, 0, 2)) == [
        friday_evening,
        berlin(2026, 3, 6, 23, 59),
        berlin(2026, 3, 9),
        berlin(2026, 3, 9, 0, 1),
    ]


# -- the model: a trigger and its calendars validated together ------------------------------


def weekend_calendar(**fields) -> Calendar:
    values = {"name": "weekends", "timezone": "Europe/Berlin", "closed_weekdays": [5, 6]}
    return Calendar.objects.create(**(values | fields))


def per_minute(mode: str, calendar: Calendar, **fields) -> Schedule:
    schedule = ScheduleFactory(cron="* * * * *", interval=None, timezone="Europe/Berlin",
                               on_closed_day=mode, **fields)  # fmt: skip
    schedule.calendars.add(calendar)
    return schedule


@pytest.mark.django_db
@pytest.mark.parametrize("mode", MODES)
def test_a_per_minute_schedule_under_closed_weekends_saves_and_validates(mode):
    schedule = per_minute("skip", weekend_calendar())
    schedule.on_closed_day = mode
    schedule.full_clean()
    schedule.save()  # its cursor is planned again under the calendar
    schedule.refresh_from_db()
    assert schedule.next_fire_at is not None
    assert schedule.next_fire_times(3)


@pytest.mark.django_db
@pytest.mark.parametrize("mode", MODES)
def test_a_calendar_used_by_a_per_minute_schedule_saves(mode):
    calendar = weekend_calendar(closed_weekdays=[6])
    per_minute(mode, calendar)
    calendar.closed_weekdays = [5, 6]
    calendar.full_clean()
    calendar.save()


@pytest.mark.django_db
def test_a_trigger_whose_every_fire_is_closed_is_refused_on_its_calendars():
    saturdays = ScheduleFactory(cron="0 9 * * 6", interval=None, timezone="Europe/Berlin")
    saturdays.calendars.add(weekend_calendar())
    with pytest.raises(ValidationError) as refused:
        saturdays.full_clean()
    assert "No fire runs within 20,000 closed" in refused.value.message_dict["calendars"][0]


@pytest.mark.django_db
def test_a_calendar_that_would_close_every_fire_of_a_schedule_is_refused_and_not_saved():
    calendar = weekend_calendar(closed_weekdays=[6])
    saturdays = ScheduleFactory(cron="0 9 * * 6", interval=None, timezone="Europe/Berlin")
    saturdays.calendars.add(calendar)
    calendar.closed_weekdays = [5, 6]
    with pytest.raises(ValidationError) as refused:
        calendar.full_clean()
    assert "a schedule using it would never run" in refused.value.message_dict["closed_weekdays"][0]
    with pytest.raises(ValidationError):
        calendar.save()
    assert Calendar.objects.get().closed_weekdays == [6]  # nothing saved


@pytest.mark.django_db
def test_a_calendar_holds_at_most_its_bounds_of_closed_dates_and_blackouts():
    days = [(date(2030, 1, 1) + timedelta(days=n)).isoformat() for n in range(MAX_CLOSED_DATES + 1)]
    start = datetime(2030, 1, 1, tzinfo=UTC)
    freezes = [
        {"start": (start + timedelta(hours=n)).isoformat(),
         "end": (start + timedelta(hours=n, minutes=5)).isoformat()}
        for n in range(MAX_BLACKOUTS + 1)
    ]  # fmt: skip
    calendar = Calendar(name="big", timezone="UTC", closed_dates=days, blackouts=freezes)
    with pytest.raises(ValidationError) as refused:
        calendar.full_clean()
    errors = refused.value.message_dict
    assert f"at most {MAX_CLOSED_DATES:,} closed dates" in errors["closed_dates"][0]
    assert f"at most {MAX_BLACKOUTS:,} blackouts" in errors["blackouts"][0]
    with pytest.raises(ValidationError):
        calendar.save()
    assert not Calendar.objects.exists()
    calendar.closed_dates, calendar.blackouts = days[:-1], freezes[:-1]  # at the bounds
    calendar.full_clean()
    calendar.save()


@pytest.mark.django_db
def test_resuming_a_per_minute_shifting_schedule_works():
    schedule = per_minute("next_open_day", weekend_calendar())
    schedule.pause(clock.now() + timedelta(days=1), "maintenance")
    schedule.resume()
    assert Schedule.objects.get().paused_until is None


@pytest.mark.django_db
def test_pausing_and_resuming_are_refused_when_no_fire_would_be_within_reach():
    calendar = weekend_calendar(closed_weekdays=[6])
    saturdays = ScheduleFactory(cron="0 9 * * 6", interval=None, timezone="Europe/Berlin")
    saturdays.calendars.add(calendar)
    saturdays.pause(clock.now() + timedelta(days=1), "maintenance")
    Calendar.objects.update(closed_weekdays=[5, 6])  # past its validation
    with pytest.raises(ValidationError) as refused:
        saturdays.resume()
    assert "calendars" in refused.value.message_dict
    with pytest.raises(ValidationError) as refused:
        saturdays.pause(clock.now() + timedelta(days=2), "longer")
    assert "paused_until" in refused.value.message_dict


# -- the admin ----------------------------------------------------------------------------------


def calendar_form(calendar: Calendar, **overrides) -> dict:
    data = {
        "name": calendar.name, "timezone": calendar.timezone,
        "closed_weekdays": [str(day) for day in calendar.closed_weekdays],
        "closed_dates": "\n".join(calendar.closed_dates), "holidays_country": "",
        "holidays_subdivision": "", "blackouts": json.dumps(calendar.blackouts),
    }  # fmt: skip
    return data | overrides


@pytest.mark.django_db
@pytest.mark.parametrize("mode", MODES)
def test_the_admin_saves_a_per_minute_schedule_under_closed_weekends(admin_client, mode):
    calendar = weekend_calendar()
    schedule = per_minute("skip", calendar)
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    form = schedule_form_data(name=schedule.name, cron="* * * * *", timezone="Europe/Berlin",
                              calendars=[calendar.pk], on_closed_day=mode)  # fmt: skip
    response = admin_client.post(url, form)
    assert response.status_code == 302
    assert Schedule.objects.get().on_closed_day == mode


@pytest.mark.django_db
def test_the_admin_edits_a_calendar_used_by_a_per_minute_shifting_schedule(admin_client):
    calendar = weekend_calendar(closed_weekdays=[6])
    per_minute("next_open_day", calendar)
    url = reverse("admin:django_periodic_calendar_change", args=[calendar.pk])
    response = admin_client.post(url, calendar_form(calendar, closed_weekdays=["5", "6"]))
    assert response.status_code == 302
    assert Calendar.objects.get().closed_weekdays == [5, 6]


@pytest.mark.django_db
def test_the_admin_resumes_a_per_minute_shifting_schedule(admin_client):
    schedule = per_minute("next_open_day", weekend_calendar())
    schedule.pause(clock.now() + timedelta(days=1), "maintenance")
    data = {"action": "resume", "_selected_action": [schedule.pk]}
    response = admin_client.post(reverse("admin:django_periodic_schedule_changelist"), data)
    assert response.status_code == 302
    assert Schedule.objects.get().paused_until is None


@pytest.mark.django_db
def test_the_admin_add_form_refuses_a_schedule_its_calendars_never_let_run(admin_client):
    calendar = weekend_calendar()
    form = schedule_form_data(cron="0 9 * * 6", timezone="Europe/Berlin", calendars=[calendar.pk])
    response = admin_client.post(reverse("admin:django_periodic_schedule_add"), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "No fire runs within" in errors["calendars"][0]
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_the_admin_refuses_a_calendar_edit_that_would_close_every_fire(admin_client):
    calendar = weekend_calendar(closed_weekdays=[6])
    saturdays = ScheduleFactory(cron="0 9 * * 6", interval=None, timezone="Europe/Berlin")
    saturdays.calendars.add(calendar)
    url = reverse("admin:django_periodic_calendar_change", args=[calendar.pk])
    response = admin_client.post(url, calendar_form(calendar, closed_weekdays=["5", "6"]))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "would never run" in errors["closed_weekdays"][0]


@pytest.mark.django_db
def test_the_admin_refuses_more_blackouts_than_the_bound_on_the_field(admin_client):
    start = datetime(2030, 1, 1, tzinfo=UTC)
    freezes = [
        {"start": (start + timedelta(hours=n)).isoformat(),
         "end": (start + timedelta(hours=n, minutes=5)).isoformat()}
        for n in range(MAX_BLACKOUTS + 1)
    ]  # fmt: skip
    data = calendar_form(Calendar(name="big", timezone="UTC"), blackouts=json.dumps(freezes))
    response = admin_client.post(reverse("admin:django_periodic_calendar_add"), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert f"at most {MAX_BLACKOUTS:,} blackouts" in errors["blackouts"][0]


def staff_with(*codenames: str):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("codenames", "shown", "hidden"),
    [
        (["view_calendar"], "1 schedule", "secret-payroll"),
        (["view_calendar", "view_schedule"], "secret-payroll", "1 schedule"),
    ],
)
def test_used_by_names_schedules_only_to_those_who_may_view_them(client, codenames, shown, hidden):
    calendar = weekend_calendar()
    ScheduleFactory(name="secret-payroll").calendars.add(calendar)
    client.force_login(staff_with(*codenames))
    page = client.get(reverse("admin:django_periodic_calendar_change", args=[calendar.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert shown in html and hidden not in html
