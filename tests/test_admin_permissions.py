"""Every admin view and endpoint checks the user's permissions, including direct POSTs."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import Run, Schedule
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import run_url

SCHEDULES_URL = reverse("admin:django_periodic_schedule_changelist")
RUNS_URL = reverse("admin:django_periodic_run_changelist")
VIEW_ALL = ["view_schedule", "view_run", "view_lease", "view_schedulerprocess"]


def staff(client, *codenames):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client, db):
    return staff(client, *VIEW_ALL)


@pytest.fixture
def schedule(db):
    return ScheduleFactory(interval=None, cron="0 3 * * *")


def schedule_url(schedule, view="change"):
    return reverse(f"admin:django_periodic_schedule_{view}", args=[schedule.pk])


def act(client, url, action, *objects):
    return client.post(url, {"action": action, "_selected_action": [o.pk for o in objects]})


def test_a_viewer_sees_every_page(viewer, schedule, process):
    run = RunFactory(schedule=schedule, status="failed")
    pages = [
        SCHEDULES_URL,
        schedule_url(schedule),
        RUNS_URL,
        run_url(run),
        reverse("admin:django_periodic_lease_changelist"),
        reverse("admin:django_periodic_schedulerprocess_changelist"),
    ]
    for url in pages:
        assert viewer.get(url).status_code == 200, url
    preview = reverse("admin:django_periodic_schedule_preview") + f"?object_id={schedule.pk}"
    assert viewer.post(preview).status_code == 200


def test_a_viewer_is_offered_no_action_and_no_button(viewer, schedule):
    failed = RunFactory(schedule=schedule, status="failed")
    pending = RunFactory(status="pending")
    for url in (SCHEDULES_URL, RUNS_URL):
        assert 'name="action"' not in viewer.get(url).content.decode(), url
    schedule_page = viewer.get(schedule_url(schedule)).content.decode()
    assert schedule_url(schedule, "run_now") not in schedule_page
    assert 'name="cron"' not in schedule_page  # read-only
    assert 'id="periodic-preview"' in schedule_page
    assert run_url(failed, "retry") not in viewer.get(run_url(failed)).content.decode()
    assert run_url(pending, "cancel") not in viewer.get(run_url(pending)).content.decode()


def test_a_viewer_cannot_change_a_schedule_by_posting_its_form(viewer, schedule):
    response = viewer.post(schedule_url(schedule), {"name": "renamed", "enabled": ""})
    assert response.status_code == 403
    assert Schedule.objects.filter(pk=schedule.pk, name=schedule.name, enabled=True).exists()


@pytest.mark.parametrize("action", ["run_now", "enable", "resume_with_catch_up", "disable"])
def test_a_viewer_posting_a_schedule_action_changes_nothing(viewer, schedule, action):
    paused = ScheduleFactory()
    Schedule.objects.filter(pk=paused.pk).update(enabled=False)
    before = {s.pk: (s.enabled, s.next_fire_at) for s in Schedule.objects.all()}
    act(viewer, SCHEDULES_URL, action, schedule, paused)
    after = {s.pk: (s.enabled, s.next_fire_at) for s in Schedule.objects.all()}
    assert after == before
    assert not Run.objects.exists()


def test_a_viewer_cannot_press_run_now(viewer, schedule):
    assert viewer.post(schedule_url(schedule, "run_now")).status_code == 403
    assert not Run.objects.exists()


@pytest.mark.parametrize("action", ["retry", "cancel"])
def test_a_viewer_posting_a_run_action_changes_nothing(viewer, action):
    failed, pending = RunFactory(status="failed"), RunFactory(status="pending")
    act(viewer, RUNS_URL, action, failed, pending)
    assert set(Run.objects.values_list("status", flat=True)) == {"failed", "pending"}
    assert Run.objects.count() == 2


@pytest.mark.parametrize(("view", "status"), [("retry", "failed"), ("cancel", "pending")])
def test_a_viewer_cannot_press_retry_or_cancel(viewer, view, status):
    run = RunFactory(status=status)
    assert viewer.post(run_url(run, view)).status_code == 403
    run.refresh_from_db()
    assert run.status == status
    assert Run.objects.count() == 1


def test_nobody_edits_a_run_by_posting_its_form(admin_client):
    run = RunFactory(status="failed")
    response = admin_client.post(run_url(run), {"status": "succeeded"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == "failed"


def test_changing_schedules_does_not_allow_retrying_runs(client, db, schedule):
    operator = staff(client, "view_schedule", "change_schedule", "view_run")
    failed = RunFactory(schedule=schedule, status="failed")
    assert operator.post(schedule_url(schedule, "run_now")).status_code == 302
    assert operator.post(run_url(failed, "retry")).status_code == 403
    assert not Run.objects.filter(trigger="retry").exists()


def test_changing_runs_allows_retry_and_cancel(client, db):
    operator = staff(client, "view_run", "change_run")
    failed, pending = RunFactory(status="failed"), RunFactory(status="pending")
    assert operator.post(run_url(failed, "retry")).status_code == 302
    assert operator.post(run_url(pending, "cancel")).status_code == 302
    assert Run.objects.filter(trigger="retry").exists()
    pending.refresh_from_db()
    assert pending.status == "cancelled"


def test_staff_without_permissions_see_nothing(client, db, schedule):
    staff(client)
    for url in (SCHEDULES_URL, schedule_url(schedule), RUNS_URL):
        assert client.get(url).status_code == 403, url
    assert client.post(schedule_url(schedule, "run_now")).status_code == 403


def test_anonymous_posts_are_sent_to_the_login_page(client, db, schedule):
    run = RunFactory(status="failed", plan_time=clock.now() - timedelta(hours=1))
    for url in (schedule_url(schedule, "run_now"), run_url(run, "retry"), run_url(run, "cancel")):
        response = client.post(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    assert Run.objects.count() == 1
