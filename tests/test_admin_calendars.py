"""Calendars in the admin: the calendar form, a schedule's calendars, the preview's closed
fires and the schedule page's closed spans."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from django_periodic.choices import ErrorCode
from django_periodic.models import Calendar, Run, Schedule
from tests.factories import ScheduleFactory, schedule_form_data

BERLIN = ZoneInfo("Europe/Berlin")


def weekend_calendar() -> Calendar:
    return Calendar.objects.create(
        name="weekends", timezone="Europe/Berlin", closed_weekdays=[5, 6]
    )


@pytest.mark.django_db
def test_the_admin_adds_a_calendar_and_a_schedule_using_it(admin_client):
    data = {
        "name": "business", "timezone": "Europe/Berlin", "closed_weekdays": ["5", "6"],
        "closed_dates": "2026-12-24\n2026-12-31", "holidays_country": "", "blackouts": "[]",
        "holidays_subdivision": "",
    }  # fmt: skip
    response = admin_client.post(reverse("admin:django_periodic_calendar_add"), data)
    assert response.status_code == 302
    calendar = Calendar.objects.get()
    assert (calendar.closed_weekdays, calendar.closed_dates) == (
        [5, 6],
        ["2026-12-24", "2026-12-31"],
    )
    form = schedule_form_data(
        cron="0 9 * * *",
        timezone="Europe/Berlin",
        calendars=[calendar.pk],
        on_closed_day="next_open_day",
    )
    assert admin_client.post(reverse("admin:django_periodic_schedule_add"), form).status_code == 302
    schedule = Schedule.objects.get()
    assert list(schedule.calendars.all()) == [calendar]


@pytest.mark.django_db
def test_the_admin_refuses_a_bad_calendar_on_its_fields(admin_client):
    data = {
        "name": "bad", "timezone": "Europe/Berlin", "closed_dates": "24.12.2026",
        "blackouts": '[{"start": "soon"}]',
    }  # fmt: skip
    response = admin_client.post(reverse("admin:django_periodic_calendar_add"), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "24.12.2026 is not a date" in errors["closed_dates"][0]
    assert "blackout" in errors["blackouts"][0]


@pytest.mark.django_db
def test_the_preview_lists_closed_fires_with_their_calendar_and_fate(admin_client):
    calendar = weekend_calendar()
    form = schedule_form_data(
        cron="0 9 * * *",
        timezone="Europe/Berlin",
        calendars=[calendar.pk],
        on_closed_day="next_open_day",
    )
    response = admin_client.post(reverse("admin:django_periodic_schedule_preview"), form)
    payload = response.json()
    closed = [fire for fire in payload["fires"] if fire["closed"]]
    assert closed and len(payload["fires"]) > 10
    assert all("weekends: closed on " in fire["closed"] for fire in closed)
    assert all(" runs Mon " in fire["closed"] for fire in closed)
    assert "periodic-closed" in payload["html"]


@pytest.mark.django_db
def test_the_schedule_page_counts_its_closed_spans(admin_client):
    schedule = ScheduleFactory()
    Run.objects.create(
        schedule=schedule, plan_time=datetime(2026, 3, 6, 23, tzinfo=UTC), status="skipped",
        error_code=ErrorCode.CLOSED, error_message="Closed by calendar 'weekends'.",
        job_name=schedule.job,
    )  # fmt: skip
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    html = page.content.decode()
    assert "closed fires" in html.lower()
    assert "2026-03-06 23:00:00 UTC" in html and "Closed by calendar" in html


@pytest.mark.django_db
def test_a_calendar_stored_bad_is_refused_on_the_schedule_form_and_does_not_break_saving(
    admin_client,
):
    calendar = weekend_calendar()
    schedule = ScheduleFactory(cron="0 9 * * *", interval=None)
    schedule.calendars.add(calendar)
    Calendar.objects.filter(pk=calendar.pk).update(timezone="Mars/Olympus")
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    form = schedule_form_data(name=schedule.name, cron="0 9 * * *", calendars=[calendar.pk])
    response = admin_client.post(url, form)
    assert "Mars/Olympus" in response.context["adminform"].form.errors["calendars"][0]
    # Unticking it saves, and plans the schedule again without it (a change of its fires,
    # confirmed as its diff page asks: admin/changes/explain.py).
    unticked = schedule_form_data(name=schedule.name, _confirmed_diff="1")
    assert admin_client.post(url, unticked).status_code == 302
    assert not Schedule.objects.get().calendars.exists()
