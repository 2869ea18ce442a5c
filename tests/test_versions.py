"""Versions: every change of a schedule through the app's surface is a ScheduleVersion with
its changes field by field, who made it and why; the scheduler's own writes make none;
QuerySet.update() makes none, update_versioned() does; a version can be restored."""

import os
import re
import socket
import zoneinfo
from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic import job, registry
from django_periodic.db import clock
from django_periodic.engine.planning import code_schedules, planner
from django_periodic.models import (
    Calendar,
    Schedule,
    SchedulerProcess,
    ScheduleVersion,
    changed_by,
    restore_version,
)
from django_periodic.models.schedule_fields import VERSIONED_FIELDS
from django_periodic.operations import retention
from tests.factories import ScheduleFactory, schedule_form_data
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import save_together

pytestmark = pytest.mark.django_db


def versions_of(schedule: Schedule) -> list[ScheduleVersion]:
    """Oldest first, read from the table (not through the instance)."""
    return list(ScheduleVersion.objects.filter(schedule_id=schedule.pk).order_by("id"))


# -- save() ------------------------------------------------------------------------------------


def test_creating_a_schedule_makes_its_first_version_with_every_field_from_none():
    with changed_by("alice", "new report"):
        schedule = Schedule.objects.create(name="report", job="tests.jobs.noop", cron="0 3 * * *")
    (version,) = versions_of(schedule)
    assert (version.by, version.reason, version.revision) == ("alice", "new report", 1)
    # Every versioned field by its column's attribute (a concurrency limit by its id).
    columns = [Schedule._meta.get_field(n).attname for n in VERSIONED_FIELDS if n != "calendars"]
    assert sorted(version.changes) == sorted(columns)
    assert version.changes["cron"] == [None, "0 3 * * *"]
    assert version.changes["misfire_grace"] == [None, "P0DT00H01M00S"]  # ISO 8601
    assert version.fields["calendars"] == []


def test_a_save_makes_one_version_with_the_changed_fields_old_and_new():
    schedule = ScheduleFactory(interval=timedelta(minutes=1), max_attempts=1)
    loaded = Schedule.objects.get(pk=schedule.pk)
    loaded.interval, loaded.max_attempts = timedelta(minutes=5), 3
    with changed_by("bob", "slower, with retries"):
        loaded.save()
    _, edited = versions_of(schedule)
    assert edited.changes == {
        "interval": ["P0DT00H01M00S", "P0DT00H05M00S"],
        "max_attempts": [1, 3],
    }
    assert (edited.by, edited.reason, edited.revision) == ("bob", "slower, with retries", 2)
    assert edited.fields["interval"] == "P0DT00H05M00S" and edited.fields["max_attempts"] == 3


def test_a_save_without_changed_by_is_by_this_process():
    schedule = ScheduleFactory()
    schedule.max_attempts = 4
    schedule.save()
    assert versions_of(schedule)[-1].by == f"{os.getpid()}@{socket.gethostname()}"


def test_a_version_of_a_policy_change_records_the_current_revision():
    schedule = ScheduleFactory()
    schedule.args = [1]
    schedule.save()  # revision 2
    schedule.overlap = Schedule.Overlap.QUEUE
    schedule.save()  # a policy: no new revision
    assert [v.revision for v in versions_of(schedule)] == [1, 2, 2]


def test_arguments_changed_in_place_make_a_version():
    schedule = ScheduleFactory(args=[1])
    loaded = Schedule.objects.get(pk=schedule.pk)
    loaded.args.append(2)
    loaded.save()
    assert versions_of(schedule)[-1].changes == {"args": [[1], [1, 2]]}


def test_a_save_that_changes_nothing_versioned_makes_no_version():
    schedule = ScheduleFactory()
    Schedule.objects.get(pk=schedule.pk).save()
    schedule.save()
    assert len(versions_of(schedule)) == 1


def test_times_are_recorded_in_utc_whatever_zone_they_were_given_in():
    schedule = ScheduleFactory()
    start = (clock.now() + timedelta(days=1)).replace(microsecond=0)
    schedule.start_at = start.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))
    schedule.save()
    assert versions_of(schedule)[-1].changes["start_at"] == [None, start.isoformat()]
    schedule.start_at = start  # the same time in UTC: no change
    schedule.save()
    assert len(versions_of(schedule)) == 2


def test_a_field_deferred_when_loaded_is_compared_with_the_row():
    schedule = ScheduleFactory(max_attempts=2)
    loaded = Schedule.objects.only("pk", "name").get(pk=schedule.pk)
    loaded.max_attempts = 2
    loaded.save(update_fields=["max_attempts"])
    assert len(versions_of(schedule)) == 1
    loaded.max_attempts = 5
    loaded.save(update_fields=["max_attempts"])
    assert versions_of(schedule)[-1].changes == {"max_attempts": [2, 5]}


def test_saving_twice_diffs_against_the_last_save():
    schedule = ScheduleFactory(max_attempts=1)
    schedule.max_attempts = 2
    schedule.save()
    schedule.max_attempts = 3
    schedule.save()
    assert [v.changes for v in versions_of(schedule)[1:]] == [
        {"max_attempts": [1, 2]},
        {"max_attempts": [2, 3]},
    ]


def test_a_refreshed_instance_diffs_against_the_row_it_read():
    schedule = ScheduleFactory(max_attempts=1)
    Schedule.objects.filter(pk=schedule.pk).update_versioned(by="ops", max_attempts=2)
    schedule.refresh_from_db()
    schedule.max_attempts = 3
    schedule.save()
    assert versions_of(schedule)[-1].changes == {"max_attempts": [2, 3]}


# -- pause, resume, code, import ---------------------------------------------------------------


def test_pause_and_resume_each_make_a_version_by_whoever_did_it():
    schedule = ScheduleFactory()
    until = (clock.now() + timedelta(hours=1)).replace(microsecond=0)
    schedule.pause(until, "deploy freeze", by="carol")
    schedule.resume(by="dave", reason="freeze lifted")
    _, paused, resumed = versions_of(schedule)
    assert (paused.by, paused.reason) == ("carol", "deploy freeze")
    assert paused.changes == {
        "paused_until": [None, until.isoformat()],
        "pause_reason": ["", "deploy freeze"],
        "paused_by": ["", "carol"],
    }
    assert (resumed.by, resumed.reason) == ("dave", "freeze lifted")
    assert resumed.changes["paused_until"] == [until.isoformat(), None]


def test_code_defined_schedules_are_versioned_by_code(clean_registry):
    def nightly():
        return None

    job(name="nightly", cron="0 3 * * *")(nightly)
    code_schedules.sync_code_schedules()
    code_schedules.sync_code_schedules()  # unchanged: no version
    registry._registry.pop("nightly")
    job(name="nightly", cron="0 4 * * *")(nightly)
    code_schedules.sync_code_schedules()
    schedule = Schedule.objects.get(name="nightly")
    created, changed = versions_of(schedule)
    assert (created.by, changed.by) == ("code", "code")
    assert changed.changes == {"cron": ["0 3 * * *", "0 4 * * *"]}
    assert "Defined in code (" in changed.reason
    registry._registry.pop("nightly")
    code_schedules.sync_code_schedules()  # gone from code: disabled
    gone = versions_of(schedule)[-1]
    assert gone.by == "code" and gone.changes["enabled"] == [True, False]
    assert gone.reason.startswith("No longer defined in code")


def test_the_celery_beat_import_is_versioned_by_import():
    from django_celery_beat import models as beat

    every = beat.IntervalSchedule.objects.create(every=5, period="minutes")
    beat.PeriodicTask.objects.create(name="beat-task", task="tests.jobs.noop", interval=every)
    call_command("import_celery_beat", stdout=StringIO())
    (version,) = versions_of(Schedule.objects.get(name="beat-task"))
    assert version.by == "import" and "beat-task" in version.reason
    assert version.changes["interval"] == [None, "P0DT00H05M00S"]


# -- what makes none ---------------------------------------------------------------------------


def test_update_makes_no_version_and_update_versioned_records_each_changed_row():
    changed, unchanged = ScheduleFactory(max_attempts=1), ScheduleFactory(max_attempts=2)
    both = Schedule.objects.filter(pk__in=[changed.pk, unchanged.pk])
    both.update(enabled=True)
    assert ScheduleVersion.objects.count() == 2  # the two creations
    assert both.update_versioned(by="ops", reason="bulk fix", max_attempts=2) == 2
    (version,) = ScheduleVersion.objects.exclude(pk__in=[v.pk for v in versions_of(unchanged)])[:1]
    assert len(versions_of(unchanged)) == 1
    assert version.schedule_id == changed.pk
    assert (version.by, version.reason, version.changes) == (
        "ops",
        "bulk fix",
        {"max_attempts": [1, 2]},
    )
    assert Schedule.objects.get(pk=changed.pk).max_attempts == 2


def test_scheduler_writes_make_no_version():
    """The planner's and the outcome's writes (cursor, counters): none is a version."""
    schedule = ScheduleFactory(interval=timedelta(seconds=1), alert_failures=1)
    planner.plan_due(schedule.next_fire_at + timedelta(seconds=5))
    stored = Schedule.objects.get(pk=schedule.pk)
    assert stored.next_fire_at > schedule.next_fire_at  # the cursor moved
    assert len(versions_of(schedule)) == 1


@pytest.mark.processes
def test_a_running_scheduler_makes_no_version(children):
    child = children.start("--workers", "2")
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    start = clock.now().replace(microsecond=0) + timedelta(seconds=1)
    schedule = ScheduleFactory(
        job="tests.jobs.record", interval=timedelta(seconds=1), start_at=start, alert_failures=1
    )
    runs = Execution.objects.filter(schedule=schedule.name)
    wait_for(lambda: runs.count() >= 3, 30, "three runs of its job")
    assert child.terminate() == 0
    assert Schedule.objects.get(pk=schedule.pk).next_fire_at > start
    assert len(versions_of(schedule)) == 1


# -- concurrency -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_edits_make_two_versions_with_distinct_revisions():
    """Two threads, each its own connection, save the same loaded state at once: the second
    waits on the first's row lock, and both versions record the revision they made."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    schedule = ScheduleFactory(interval=timedelta(minutes=1))
    save_together(
        Schedule,
        schedule.pk,
        {f"editor-{n}": {"interval": timedelta(minutes=n)} for n in (2, 3)},
    )
    edits = versions_of(schedule)[1:]
    assert sorted(v.revision for v in edits) == [2, 3]
    assert Schedule.objects.get(pk=schedule.pk).revision == 3
    last = max(edits, key=lambda v: v.revision)  # the save that committed last
    iso = {timedelta(minutes=2): "P0DT00H02M00S", timedelta(minutes=3): "P0DT00H03M00S"}
    assert last.fields["interval"] == iso[Schedule.objects.get(pk=schedule.pk).interval]


# -- restoring ---------------------------------------------------------------------------------


def test_restoring_a_version_writes_its_fields_back_as_a_new_version():
    holidays = Calendar.objects.create(name="holidays")
    schedule = ScheduleFactory(interval=timedelta(minutes=1), max_attempts=1)
    schedule.calendars.set([holidays])
    schedule.max_attempts = 2  # recorded with its calendars
    schedule.save()
    good = versions_of(schedule)[-1]
    schedule.interval, schedule.max_attempts = timedelta(minutes=7), 5
    schedule.save()
    schedule.calendars.set([])
    restore_version(good, by="erin")
    stored = Schedule.objects.get(pk=schedule.pk)
    assert (stored.interval, stored.max_attempts) == (timedelta(minutes=1), 2)
    assert list(stored.calendars.values_list("name", flat=True)) == ["holidays"]
    restored = versions_of(schedule)[-1]
    assert restored.by == "erin"
    assert restored.reason.startswith(f"Restored revision {good.revision} ")
    assert restored.changes["interval"] == ["P0DT00H07M00S", "P0DT00H01M00S"]
    assert restored.changes["calendars"] == [[], ["holidays"]]


def test_a_restore_that_no_longer_validates_saves_nothing():
    schedule = ScheduleFactory(job="tests.jobs.noop")
    first = versions_of(schedule)[0]
    ScheduleVersion.objects.filter(pk=first.pk).update(
        fields={**first.fields, "job": "tests.jobs.gone"}
    )
    first.refresh_from_db()
    schedule.max_attempts = 3
    schedule.save()
    with pytest.raises(ValidationError) as raised:
        restore_version(first)
    assert "job" in raised.value.message_dict
    assert Schedule.objects.get(pk=schedule.pk).max_attempts == 3
    assert len(versions_of(schedule)) == 2


# -- the admin ---------------------------------------------------------------------------------


def test_an_admin_edit_is_a_version_by_the_user_with_the_reason_and_calendars(admin_client):
    Calendar.objects.create(name="holidays")
    add = reverse("admin:django_periodic_schedule_add")
    assert admin_client.post(add, schedule_form_data()).status_code == 302
    schedule = Schedule.objects.get(name="from-admin")
    holidays = Calendar.objects.get(name="holidays")
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    data = schedule_form_data(
        cron="0 * * * *", calendars=[holidays.pk], version_reason="hourly is enough"
    )
    # Its fires change: the admin shows the diff first, and saves once it is confirmed.
    assert admin_client.post(url, data).status_code == 200
    assert len(versions_of(schedule)) == 1  # nothing saved yet
    assert admin_client.post(url, {**data, "_confirmed_diff": "1"}).status_code == 302
    created, edited = versions_of(schedule)
    assert created.by == edited.by == "admin"
    assert "calendars" not in created.changes  # none chosen
    assert edited.reason == "hourly is enough"
    assert edited.changes == {
        "cron": ["* * * * *", "0 * * * *"],
        "calendars": [[], ["holidays"]],
    }
    assert edited.fields["calendars"] == ["holidays"]


def test_the_history_page_shows_the_diff_and_restore_restores(admin_client):
    schedule = ScheduleFactory(max_attempts=1)
    with changed_by("bob", "more retries"):
        schedule.max_attempts = 4
        schedule.save()
    history = reverse("admin:django_periodic_schedule_history", args=[schedule.pk])
    page = admin_client.get(history).content.decode()
    assert "more retries" in page and "bob" in page and "max_attempts" in page
    first = versions_of(schedule)[0]
    restore = reverse("admin:django_periodic_schedule_restore", args=[schedule.pk, first.pk])
    assert admin_client.get(restore).status_code == 405
    assert admin_client.post(restore).status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).max_attempts == 1
    assert versions_of(schedule)[-1].by == "admin"


def test_the_history_page_anchors_the_newest_version_of_each_revision(admin_client):
    schedule = ScheduleFactory(max_attempts=1, interval=timedelta(minutes=1))
    schedule.max_attempts = 2  # a policy: the same revision
    schedule.save()
    schedule.interval = timedelta(minutes=2)  # a trigger: a new revision
    schedule.save()
    history = reverse("admin:django_periodic_schedule_history", args=[schedule.pk])
    page = admin_client.get(history).content.decode()
    rows = re.findall(r'<tr class="periodic-version"[^>]*>', page)
    assert [re.findall(r'id="([^"]+)"', row) for row in rows] == [
        ["revision-2"],
        ["revision-1"],
        [],
    ]


def test_a_restore_in_the_admin_that_no_longer_validates_says_why_and_saves_nothing(
    admin_client,
):
    schedule = ScheduleFactory(max_attempts=1)
    first = versions_of(schedule)[0]
    ScheduleVersion.objects.filter(pk=first.pk).update(
        fields={**first.fields, "job": "tests.jobs.gone"}
    )
    schedule.max_attempts = 2
    schedule.save()
    restore = reverse("admin:django_periodic_schedule_restore", args=[schedule.pk, first.pk])
    response = admin_client.post(restore, follow=True)
    shown = [str(message) for message in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("Not restored: job: ")
    assert Schedule.objects.get(pk=schedule.pk).max_attempts == 2
    assert len(versions_of(schedule)) == 2


def test_the_admins_disable_and_enable_actions_are_versions_by_the_user(admin_client):
    schedule = ScheduleFactory()
    changelist = reverse("admin:django_periodic_schedule_changelist")
    for action in ("disable", "enable"):
        data = {"action": action, "_selected_action": [schedule.pk]}
        assert admin_client.post(changelist, data).status_code == 302
    disabled, enabled = versions_of(schedule)[1:]
    assert (disabled.by, disabled.changes) == ("admin", {"enabled": [True, False]})
    assert (enabled.by, enabled.changes) == ("admin", {"enabled": [False, True]})


def test_the_history_page_costs_the_same_queries_for_few_or_many_versions(admin_client):
    def queries_for(edits: int) -> int:
        schedule = ScheduleFactory(max_attempts=1)
        edited(schedule, edits)
        history = reverse("admin:django_periodic_schedule_history", args=[schedule.pk])
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(history).status_code == 200
        return len(captured.captured_queries)

    assert queries_for(1) == queries_for(30)


def test_restoring_needs_the_change_permission(client, django_user_model):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(viewer)
    schedule = ScheduleFactory(max_attempts=1)
    schedule.max_attempts = 2
    schedule.save()
    first = versions_of(schedule)[0]
    restore = reverse("admin:django_periodic_schedule_restore", args=[schedule.pk, first.pk])
    assert client.post(restore).status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).max_attempts == 2


# -- retention ---------------------------------------------------------------------------------


def edited(schedule: Schedule, times: int) -> None:
    for attempts in range(2, 2 + times):
        schedule.max_attempts = attempts
        schedule.save()


def test_a_save_deletes_its_schedules_versions_past_keep_versions(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 2}
    busy, quiet = ScheduleFactory(), ScheduleFactory()
    edited(busy, 4)  # five versions written, each trimming the older ones
    assert [v.changes["max_attempts"][1] for v in versions_of(busy)] == [4, 5]
    assert len(versions_of(quiet)) == 1


def test_a_save_trims_in_one_statement(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 1}
    schedule = ScheduleFactory()
    schedule.max_attempts = 2
    with CaptureQueriesContext(connection) as captured:
        schedule.save()
    deletes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 1 and "periodic_scheduleversion" in deletes[0]
    assert len(versions_of(schedule)) == 1


def test_a_save_rolled_back_trims_nothing(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    schedule = ScheduleFactory()
    edited(schedule, 2)
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 1}
    with pytest.raises(RuntimeError), transaction.atomic():
        schedule.max_attempts = 9
        schedule.save()
        assert len(versions_of(schedule)) == 1  # trimmed with the write...
        raise RuntimeError
    assert len(versions_of(schedule)) == 3  # ...and back with its rollback


def test_update_versioned_trims_every_schedule_it_changed(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 2}
    changed, other = ScheduleFactory(), ScheduleFactory()
    edited(changed, 1)
    edited(other, 1)
    Schedule.objects.filter(pk=changed.pk).update_versioned(by="ops", max_attempts=7)
    assert [v.by for v in versions_of(changed)][-1] == "ops"
    assert len(versions_of(changed)) == 2 and len(versions_of(other)) == 2


def test_without_keep_versions_every_version_is_kept(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    schedule = ScheduleFactory()
    edited(schedule, 3)
    call_command("prune_runs", stdout=StringIO())
    assert len(versions_of(schedule)) == 4


def lowered_keep_versions(settings, keep: int) -> Schedule:
    """A schedule with three versions, written while every version was kept; then
    ``KEEP_VERSIONS`` lowered to ``keep``."""
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    schedule = ScheduleFactory()
    edited(schedule, 2)
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": keep}
    return schedule


def test_the_periodic_pass_leaves_versions_alone(settings, now):
    schedule = lowered_keep_versions(settings, 1)
    pruned = sum((p for p in retention.prune(now)), retention.Pruned())
    assert pruned.versions == 0 and len(versions_of(schedule)) == 3


def test_prune_runs_deletes_the_versions_past_a_lowered_keep_versions(settings):
    schedule = lowered_keep_versions(settings, 1)
    newest = versions_of(schedule)[-1].pk
    out = StringIO()
    call_command("prune_runs", stdout=out)
    assert "Deleted 2 versions; kept the newest 1 of each schedule" in out.getvalue()
    assert [v.pk for v in versions_of(schedule)] == [newest]


def test_a_dry_run_counts_the_versions_it_would_delete(settings, now):
    schedule = lowered_keep_versions(settings, 1)
    pruned = sum((p for p in retention.prune(now, dry_run=True, versions=True)), retention.Pruned())
    assert pruned.versions == 2 and len(versions_of(schedule)) == 3
