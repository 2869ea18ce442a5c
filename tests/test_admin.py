import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_periodic.models import Run, Schedule
from tests.factories import RunFactory, ScheduleFactory

ADD_URL = reverse("admin:django_periodic_schedule_add")


def form_data(**overrides):
    data = {
        "name": "from-admin",
        "job": "tests.jobs.add",
        "args": "[1, 2]",
        "kwargs": "{}",
        "enabled": "on",
        "cron": "* * * * *",
        "timezone": "UTC",
        "overlap": "skip",
        "max_queued": "1",
        "misfire": "latest",
        "misfire_grace": "00:01:00",
        "max_attempts": "1",
        "retry_backoff": "00:00:10",
        "lease_timeout": "00:00:30",
    }
    data.update(overrides)
    return data


@pytest.fixture
def admin_client(client, db):
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    return client


def test_a_schedule_created_in_the_admin_gets_its_cursor(admin_client):
    response = admin_client.post(ADD_URL, form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Schedule.objects.get(name="from-admin").next_fire_at is not None


def test_the_admin_names_the_wrong_cron_field(admin_client):
    response = admin_client.post(ADD_URL, form_data(cron="* 25 * * *"))
    errors = response.context["adminform"].form.errors
    assert "hour" in errors["cron"][0]
    assert not Schedule.objects.exists()


def test_the_admin_offers_only_registered_jobs(admin_client):
    response = admin_client.post(ADD_URL, form_data(job="tests.jobs.nope"))
    assert "job" in response.context["adminform"].form.errors
    page = admin_client.get(ADD_URL).content.decode()
    assert "tests.jobs.add — Adds two numbers." in page


def test_run_now_action_records_a_manual_run(admin_client):
    schedule = ScheduleFactory()
    url = reverse("admin:django_periodic_schedule_changelist")
    admin_client.post(url, {"action": "run_now", "_selected_action": [schedule.pk]})
    assert Run.objects.get(schedule=schedule).trigger == "manual"


def test_run_history_is_read_only_and_lists_without_errors(admin_client):
    run = RunFactory(status="failed", error_code="ValueError")
    assert admin_client.get(reverse("admin:django_periodic_run_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:django_periodic_run_change", args=[run.pk]))
    assert page.status_code == 200
    assert admin_client.get(reverse("admin:django_periodic_run_add")).status_code == 403


def test_run_now_needs_the_change_permission(client, db):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(viewer)
    schedule = ScheduleFactory()
    url = reverse("admin:django_periodic_schedule_changelist")
    client.post(url, {"action": "run_now", "_selected_action": [schedule.pk]})
    assert not Run.objects.exists()
