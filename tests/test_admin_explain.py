"""The admin's "Explain" page (each fire of a window, what became of it) and the page that
shows which fires a change of the trigger adds, removes or moves before it is saved."""

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils.html import escape

from django_periodic.db import clock
from django_periodic.models import Schedule
from django_periodic.models.explaining.pages import PAGE_SIZE
from django_periodic.testing import fire_times, run_due
from tests.factories import ScheduleFactory, schedule_form_data
from tests.helpers import far_hour, run_url, set_cursor
from tests.test_admin_permissions import VIEW_ALL, staff

FORM_TIME = "%Y-%m-%dT%H:%M:%S"


def explain_url(schedule: Schedule) -> str:
    return reverse("admin:django_periodic_schedule_explain", args=[schedule.pk])


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_periodic_schedule_change", args=[schedule.pk])


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_each_fire_of_a_custom_window_with_its_run_linked(client):
    now = clock.now() + timedelta(hours=1)
    at = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0)
    schedule = ScheduleFactory(cron="*/10 * * * *", interval=None, timezone="UTC")
    set_cursor(schedule, at)
    (run,) = run_due(now=at)
    viewer = staff(client, *VIEW_ALL)
    page = viewer.get(change_url(schedule))
    assert explain_url(schedule) in page.content.decode()  # the link on its page
    window = {
        "window": "custom",
        "since": (at - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S"),
        "until": (at + timedelta(minutes=15)).strftime("%Y-%m-%dT%H:%M:%S"),
    }
    response = viewer.get(explain_url(schedule), window)
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(account.status, tone) for account, tone, _ in rows] == [
        ("succeeded", "ok"),
        ("not_planned_yet", ""),
    ]
    assert rows[0][2] == run_url(run)
    assert run_url(run) in response.content.decode()


@pytest.mark.django_db
def test_a_window_that_is_not_one_is_refused_with_why(admin_client):
    schedule = ScheduleFactory()
    response = admin_client.get(explain_url(schedule), {"window": "custom", "since": ""})
    assert response.status_code == 400
    assert response.context["error"] == "Give both ends of the window."
    assert admin_client.get(explain_url(schedule)).context["page"] is not None  # last 24 h


def custom(since: datetime | str, until: datetime | str) -> dict[str, str]:
    """The query of a custom window, as the form sends it (the tests' time zone is UTC)."""
    shown = [t.strftime(FORM_TIME) if isinstance(t, datetime) else t for t in (since, until)]
    return {"window": "custom", "since": shown[0], "until": shown[1]}


@pytest.mark.django_db
def test_a_viewer_walks_a_long_window_a_page_at_a_time_each_fire_once(client):
    schedule = ScheduleFactory(cron="* * * * *", interval=None, timezone="UTC")
    since = (clock.now() + timedelta(days=1)).replace(second=0, microsecond=0)
    until = since + timedelta(hours=50)  # 3,000 fires: three pages
    viewer = staff(client, *VIEW_ALL)
    walked: list[datetime] = []
    response = viewer.get(explain_url(schedule), custom(since, until))
    while True:
        assert response.status_code == 200
        rows = response.context["rows"]
        assert 0 < len(rows) <= PAGE_SIZE
        walked += [account.plan_time for account, _, _ in rows]
        next_url = response.context["next_url"]
        if not next_url:
            break
        assert f'href="{escape(next_url)}"' in response.content.decode()
        response = viewer.get(explain_url(schedule) + next_url)
    assert walked == fire_times(schedule, since, until)
    assert len(walked) == 3_000


@pytest.mark.django_db
def test_a_window_of_centuries_shows_its_first_page_and_links_the_next(client):
    schedule = ScheduleFactory(cron="* * * * *", interval=None, timezone="UTC")
    viewer = staff(client, *VIEW_ALL)
    response = viewer.get(
        explain_url(schedule), custom("1900-01-01T00:00:00", "8999-12-31T00:00:00")
    )
    assert response.status_code == 200
    rows = response.context["rows"]
    assert len(rows) == PAGE_SIZE
    assert rows[0][0].plan_time == datetime(1900, 1, 1, tzinfo=UTC)
    assert rows[0][0].status == "before_created"
    assert response.context["next_url"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query, error",
    [
        (custom("0001-01-01T00:00:00", "2020-01-01T00:00:00"), "since must be at least 1900-01-01"),
        (custom("2020-01-01T00:00:00", "9999-12-31T23:59:59-05:00"), "until must be at most 9000"),
        ({"after": "9999-12-31T23:59:59-05:00"}, "after must be before 9000-01-01"),
        ({"after": "0001-01-01T00:00:00+05:00"}, "after must be at least 1900-01-01"),
        ({"after": "yesterday"}, "Not a page of this window"),
    ],
)
def test_a_time_out_of_range_is_refused_with_a_400_saying_why(client, query, error):
    schedule = ScheduleFactory(cron="* * * * *", interval=None, timezone="UTC")
    response = staff(client, *VIEW_ALL).get(explain_url(schedule), query)
    assert response.status_code == 400
    assert error in response.context["error"]
    assert error in response.content.decode()
    assert response.context["rows"] == []


@pytest.mark.django_db
def test_a_user_without_view_permission_cannot_explain(client):
    schedule = ScheduleFactory()
    assert staff(client).get(explain_url(schedule)).status_code == 403


@pytest.mark.django_db
def test_a_trigger_edit_shows_its_fires_diff_and_saves_only_when_confirmed(admin_client):
    # Edited between the old and the new hour, today's fire would be added, not moved.
    hour = far_hour()
    old, new = f"0 {hour} * * *", f"0 {hour + 1} * * *"
    schedule = ScheduleFactory(cron=old, interval=None, job="tests.jobs.add", args=[1, 2])
    data = schedule_form_data(name=schedule.name, cron=new)
    response = admin_client.post(change_url(schedule), data)
    assert response.status_code == 200
    diff = response.context["diff"]
    assert len(diff.moved) >= 30 and not diff.added and not diff.removed
    assert Schedule.objects.get(pk=schedule.pk).cron == old  # not saved
    # The page posts the form's data back, confirmed.
    hidden = dict(response.context["hidden"])
    assert hidden["cron"] == new
    confirmed = admin_client.post(change_url(schedule), {**data, "_confirmed_diff": "1"})
    assert confirmed.status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).cron == new


@pytest.mark.django_db
def test_an_edit_that_keeps_the_fires_saves_at_once(admin_client):
    schedule = ScheduleFactory(cron="0 9 * * *", interval=None, job="tests.jobs.add", args=[1, 2])
    data = schedule_form_data(name=schedule.name, cron="0 9 * * *", args="[3, 4]")
    assert admin_client.post(change_url(schedule), data).status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).args == [3, 4]


@pytest.mark.django_db
def test_an_invalid_edit_shows_the_form_errors_not_a_diff(admin_client):
    schedule = ScheduleFactory(cron="0 9 * * *", interval=None, job="tests.jobs.add", args=[1, 2])
    data = schedule_form_data(name=schedule.name, cron="0 25 * * *")
    response = admin_client.post(change_url(schedule), data)
    assert "diff" not in response.context
    assert response.context["adminform"].form.errors["cron"]
