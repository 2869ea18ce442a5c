"""Schedule.revision: bumped when what a schedule calls or when it fires changes, and recorded
by every run, so history says which version of the schedule produced each run."""

from datetime import timedelta

import pytest
from django.urls import reverse

from django_periodic import job, registry
from django_periodic.engine.planning import code_schedules, planner
from django_periodic.engine.runs import retries
from django_periodic.models import Run, Schedule
from django_periodic.models.schedule_fields import REVISION_FIELDS, TRIGGER_FIELDS
from tests.factories import RunFactory, ScheduleFactory, schedule_form_data
from tests.helpers import set_cursor

pytestmark = pytest.mark.django_db


def revision_of(schedule: Schedule) -> int:
    return Schedule.objects.values_list("revision", flat=True).get(pk=schedule.pk)


# -- what bumps it -----------------------------------------------------------------------------


def test_a_new_schedule_is_at_revision_one():
    assert ScheduleFactory().revision == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job", "tests.jobs.add"),
        ("args", [1]),
        ("kwargs", {"a": 1}),
        ("interval", timedelta(minutes=5)),
        ("timezone", "Europe/Berlin"),
        ("end_at", None),
    ],
)
def test_saving_a_changed_trigger_job_or_argument_bumps_the_revision(field, value, now):
    schedule = ScheduleFactory(end_at=now + timedelta(days=1))
    setattr(schedule, field, value)
    schedule.save()
    assert schedule.revision == revision_of(schedule) == 2


def test_every_revision_field_is_one_of_the_trigger_job_or_argument_fields():
    assert set(REVISION_FIELDS) == {"job", "args", "kwargs", "scopes", *TRIGGER_FIELDS}


def test_saving_policies_or_pausing_keeps_the_revision():
    schedule = ScheduleFactory()
    schedule.max_attempts, schedule.overlap, schedule.enabled = 3, "queue", False
    schedule.save()
    schedule.save()
    assert revision_of(schedule) == 1


def test_arguments_changed_in_place_bump_the_revision():
    schedule = ScheduleFactory(kwargs={"a": 1})
    schedule.kwargs["a"] = 2
    schedule.save()
    assert revision_of(schedule) == 2


def test_save_with_update_fields_bumps_only_when_it_writes_a_changed_revision_field():
    schedule = ScheduleFactory()
    schedule.interval, schedule.max_attempts = timedelta(minutes=7), 2
    schedule.save(update_fields=["max_attempts"])
    assert revision_of(schedule) == 1
    schedule.save(update_fields=["interval"])
    assert revision_of(schedule) == 2


def test_an_instance_loaded_with_only_some_fields_bumps_when_a_deferred_one_is_set():
    ScheduleFactory(name="partial")
    schedule = Schedule.objects.only("pk", "name").get(name="partial")
    schedule.args = [1]
    schedule.save()
    assert revision_of(schedule) == 2


def test_two_concurrent_edits_make_two_revisions():
    created = ScheduleFactory()
    first, second = Schedule.objects.get(pk=created.pk), Schedule.objects.get(pk=created.pk)
    first.interval = timedelta(minutes=2)
    second.interval = timedelta(minutes=3)
    first.save()
    second.save()
    assert (first.revision, second.revision, revision_of(created)) == (2, 3, 3)


def test_queryset_update_of_a_revision_field_bumps_every_updated_row():
    touched, other = ScheduleFactory(), ScheduleFactory()
    Schedule.objects.filter(pk=touched.pk).update(cron="*/5 * * * *", interval=None)
    assert (revision_of(touched), revision_of(other)) == (2, 1)


def test_queryset_update_of_other_fields_keeps_the_revision():
    schedule = ScheduleFactory()
    Schedule.objects.filter(pk=schedule.pk).update(max_attempts=4, enabled=False)
    assert revision_of(schedule) == 1


def test_bulk_update_of_a_revision_field_bumps_the_revision():
    schedules = [ScheduleFactory(), ScheduleFactory()]
    for schedule in schedules:
        schedule.args = [9]
    Schedule.objects.bulk_update(schedules, ["args"])
    assert [revision_of(s) for s in schedules] == [2, 2]


def test_an_admin_edit_of_the_trigger_bumps_the_revision(admin_client):
    schedule = ScheduleFactory(cron="* * * * *", interval=None, job="tests.jobs.add", args=[1, 2])
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    # Confirmed, as the page of the fires it changes asks (admin/changes/explain.py).
    edited = schedule_form_data(name=schedule.name, cron="*/2 * * * *", _confirmed_diff="1")
    assert admin_client.post(url, edited).status_code == 302
    assert revision_of(schedule) == 2


def test_an_admin_save_without_changes_keeps_the_revision(admin_client):
    schedule = ScheduleFactory(cron="* * * * *", interval=None, job="tests.jobs.add", args=[1, 2])
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    response = admin_client.post(url, schedule_form_data(name=schedule.name))
    assert response.status_code == 302
    assert revision_of(schedule) == 1


def test_the_code_sync_bumps_the_revision_when_the_code_changes_the_trigger(clean_registry):
    def nightly():
        return None

    job(name="nightly", cron="0 3 * * *")(nightly)
    code_schedules.sync_code_schedules()
    code_schedules.sync_code_schedules()
    assert revision_of(Schedule.objects.get(name="nightly")) == 1
    registry._registry.pop("nightly")
    job(name="nightly", cron="0 4 * * *")(nightly)
    code_schedules.sync_code_schedules()
    assert revision_of(Schedule.objects.get(name="nightly")) == 2


# -- what records it ---------------------------------------------------------------------------


def test_planned_runs_record_the_revision_that_planned_them(now):
    schedule = ScheduleFactory(interval=timedelta(minutes=1))
    planner.plan_due(schedule.next_fire_at)
    schedule.refresh_from_db()
    schedule.kwargs = {"changed": True}
    schedule.job = "tests.jobs.noop"
    schedule.save()
    planner.plan_due(schedule.next_fire_at)
    runs = Run.objects.filter(schedule=schedule).order_by("plan_time")
    assert [(r.schedule_revision, r.kwargs) for r in runs] == [(1, {}), (2, {"changed": True})]


def test_runs_planned_in_one_batch_record_each_schedules_own_revision(now):
    first, second = ScheduleFactory(), ScheduleFactory()
    Schedule.objects.filter(pk=second.pk).update(args=[1])  # revision 2
    Schedule.objects.update(next_fire_at=now)
    planner.plan_due(now)
    recorded = dict(Run.objects.values_list("schedule_id", "schedule_revision"))
    assert recorded == {first.pk: 1, second.pk: 2}


def test_a_manual_run_records_the_current_revision():
    schedule = ScheduleFactory()
    Schedule.objects.filter(pk=schedule.pk).update(args=[5])
    assert schedule.run_now().schedule_revision == 2


def test_fanned_out_runs_record_the_revision(now):
    schedule = ScheduleFactory(job="tests.jobs.per_tenant", scopes="tests.regions")
    Schedule.objects.filter(pk=schedule.pk).update(kwargs={"greeting": "hi"})
    set_cursor(schedule, now)
    planner.plan_due(now)
    assert set(Run.objects.values_list("scope", "schedule_revision")) == {("eu", 2), ("us", 2)}


def test_a_retry_records_the_revision_of_the_run_it_repeats(now):
    schedule = ScheduleFactory()
    failed = RunFactory(schedule=schedule, status=Run.Status.FAILED, plan_time=now)
    schedule.args = [1]
    schedule.save()
    retry = retries.plan_retry(failed, now)
    assert (failed.schedule_revision, retry.schedule_revision) == (1, 1)


# -- where it shows ----------------------------------------------------------------------------


def test_the_run_list_and_page_show_the_revision_linked_to_its_versions(admin_client):
    run = RunFactory(schedule=ScheduleFactory(), schedule_revision=7)
    history = reverse("admin:django_periodic_schedule_history", args=[run.schedule_id])
    link = f'<a href="{history}#revision-7">7</a>'
    listing = admin_client.get(reverse("admin:django_periodic_run_changelist"))
    assert f'<td class="field-revision_link">{link}</td>' in listing.content.decode()
    page = admin_client.get(reverse("admin:django_periodic_run_change", args=[run.pk]))
    assert "Revision:" in page.content.decode() and link in page.content.decode()


def test_the_schedule_page_shows_its_revision_and_its_runs_revisions(admin_client):
    schedule = ScheduleFactory()
    RunFactory(schedule=schedule, schedule_revision=1, status=Run.Status.SUCCEEDED)
    Schedule.objects.filter(pk=schedule.pk).update(args=[3])
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    html = page.content.decode()
    assert '<div class="readonly">2</div>' in html
    assert "revision 1" in html  # the recent runs' squares
