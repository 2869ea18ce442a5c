"""Deleting a schedule with its history: who may, what the confirmation says, what it costs."""

from datetime import timedelta

from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic.admin.actions import deletion
from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule
from tests.factories import ScheduleFactory, SchedulerProcessFactory

LIST_URL = reverse("admin:django_periodic_schedule_changelist")


def delete_url(schedule):
    return reverse("admin:django_periodic_schedule_delete", args=[schedule.pk])


def with_history(runs: int, leases_each: int = 1, **fields) -> Schedule:
    """A schedule with ``runs`` runs, each with ``leases_each`` leases (in bulk)."""
    schedule = ScheduleFactory(**fields)
    now = clock.now()
    created = Run.objects.bulk_create(
        Run(schedule=schedule, plan_time=now - timedelta(minutes=i), status="succeeded")
        for i in range(runs)
    )
    process = SchedulerProcessFactory(started_at=now)
    Lease.objects.bulk_create(
        Lease(
            run=run,
            attempt=attempt,
            process=process,
            holder=str(process),
            acquired_at=now,
            heartbeat_at=now,
            expires_at=now,
        )
        for run in created
        for attempt in range(1, leases_each + 1)
    )
    return schedule


def staff(client, *codenames):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def history_of(schedule) -> tuple[int, int]:
    runs = Run.objects.filter(schedule_id=schedule.pk)
    return runs.count(), Lease.objects.filter(run__in=runs).count()


def test_a_superuser_deletes_a_schedule_with_its_runs_and_leases(admin_client):
    schedule, kept = with_history(3, leases_each=2), with_history(2)
    page = admin_client.get(delete_url(schedule))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Cannot delete" not in html
    assert "<li>Schedules: 1</li>" in html
    assert "<li>Runs: 3</li>" in html
    assert "<li>Leases: 6</li>" in html
    response = admin_client.post(delete_url(schedule), {"post": "yes"})
    assert response.status_code == 302
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    assert history_of(schedule) == (0, 0)
    assert history_of(kept) == (2, 2)


def test_deleting_a_schedule_needs_only_the_permission_to_delete_schedules(client, db):
    schedule = with_history(2)
    operator = staff(client, "view_schedule", "delete_schedule")
    assert "Cannot delete" not in operator.get(delete_url(schedule)).content.decode()
    assert operator.post(delete_url(schedule), {"post": "yes"}).status_code == 302
    assert not Schedule.objects.exists()
    assert history_of(schedule) == (0, 0)


def test_without_the_permission_to_delete_schedules_nothing_is_deleted(client, db):
    schedule = with_history(2)
    operator = staff(client, "view_schedule", "change_schedule", "delete_run", "delete_lease")
    assert operator.get(delete_url(schedule)).status_code == 403
    assert operator.post(delete_url(schedule), {"post": "yes"}).status_code == 403
    selected = {"action": "delete_selected", "_selected_action": [schedule.pk], "post": "yes"}
    operator.post(LIST_URL, selected)
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    assert history_of(schedule) == (2, 2)


def test_the_bulk_action_counts_then_deletes_the_schedules_with_their_history(admin_client):
    first, second, kept = with_history(3), with_history(4, leases_each=3), with_history(1)
    selected = {"action": "delete_selected", "_selected_action": [first.pk, second.pk]}
    html = admin_client.post(LIST_URL, selected).content.decode()
    assert "Cannot delete" not in html
    for count in ("Schedules: 2", "Runs: 7", "Leases: 15"):
        assert f"<li>{count}</li>" in html
    assert "<li>Runs: 4</li>" in html and "<li>Leases: 12</li>" in html  # the second's own
    response = admin_client.post(LIST_URL, {**selected, "post": "yes"}, follow=True)
    assert "Successfully deleted 2 schedules." in response.content.decode()
    assert list(Schedule.objects.all()) == [kept]
    assert history_of(first) == history_of(second) == (0, 0)
    assert history_of(kept) == (1, 1)


def test_counts_are_grouped_in_thousands(admin_client):
    schedule = with_history(1200, leases_each=0)
    assert "<li>Runs: 1,200</li>" in admin_client.get(delete_url(schedule)).content.decode()


def test_runs_and_leases_are_still_not_deleted_on_their_own_pages(admin_client):
    schedule = with_history(1)
    run, lease = Run.objects.get(), Lease.objects.get()
    for model, row in (("run", run), ("lease", lease)):
        url = reverse(f"admin:django_periodic_{model}_delete", args=[row.pk])
        assert admin_client.post(url, {"post": "yes"}).status_code == 403
        listing = reverse(f"admin:django_periodic_{model}_changelist")
        assert "delete_selected" not in admin_client.get(listing).content.decode()
    assert history_of(schedule) == (1, 1)


def test_where_a_project_model_points_at_schedules_django_lists_what_goes(
    admin_client, monkeypatch
):
    # A model of the project with a foreign key to Schedule or Run, which Django's own
    # listing would find (and whose protection it would honour); the history's permission
    # still does not stand in the way.
    monkeypatch.setattr(deletion, "history_only", lambda: False)
    schedule = with_history(2)
    html = admin_client.get(delete_url(schedule)).content.decode()
    assert "Cannot delete" not in html
    assert html.count("Run: <a href=") == 2
    assert admin_client.post(delete_url(schedule), {"post": "yes"}).status_code == 302
    assert history_of(schedule) == (0, 0)


def queries(client, method: str, url: str, data=None) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = getattr(client, method)(url, data)
    assert response.status_code in (200, 302)
    return len(captured)


def test_the_confirmation_and_the_delete_cost_the_same_queries_for_3_runs_as_for_3000(
    admin_client, postgres
):
    few, many = with_history(3, leases_each=2), with_history(3000, leases_each=2)
    admin_client.get(delete_url(few))  # warm caches (content types, the session) first
    assert queries(admin_client, "get", delete_url(many)) == queries(
        admin_client, "get", delete_url(few)
    )
    deleted = queries(admin_client, "post", delete_url(few), {"post": "yes"})
    assert queries(admin_client, "post", delete_url(many), {"post": "yes"}) == deleted
    assert not Run.objects.exists()
