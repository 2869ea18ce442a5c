"""The admin's "Explain" page (each fire of a window, what became of it) and the page that
shows which fires a change of the trigger adds, removes or moves before it is saved."""

from datetime import timedelta

import pytest
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import Schedule
from django_periodic.testing import run_due
from tests.factories import ScheduleFactory, schedule_form_data
from tests.helpers import run_url, set_cursor
from tests.test_admin_permissions import VIEW_ALL, staff


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
    assert response.context["error"] == "Give both ends of the window."
    assert admin_client.get(explain_url(schedule)).context["window"] is not None  # last 24 h


@pytest.mark.django_db
def test_a_user_without_view_permission_cannot_explain(client):
    schedule = ScheduleFactory()
    assert staff(client).get(explain_url(schedule)).status_code == 403


@pytest.mark.django_db
def test_a_trigger_edit_shows_its_fires_diff_and_saves_only_when_confirmed(admin_client):
    schedule = ScheduleFactory(cron="0 9 * * *", interval=None, job="tests.jobs.add", args=[1, 2])
    data = schedule_form_data(name=schedule.name, cron="0 10 * * *")
    response = admin_client.post(change_url(schedule), data)
    assert response.status_code == 200
    diff = response.context["diff"]
    assert len(diff.moved) >= 30 and not diff.added and not diff.removed
    assert Schedule.objects.get(pk=schedule.pk).cron == "0 9 * * *"  # not saved
    # The page posts the form's data back, confirmed.
    hidden = dict(response.context["hidden"])
    assert hidden["cron"] == "0 10 * * *"
    confirmed = admin_client.post(change_url(schedule), {**data, "_confirmed_diff": "1"})
    assert confirmed.status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).cron == "0 10 * * *"


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
