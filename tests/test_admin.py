"""The schedules in the admin: the form, the list, and the actions on schedules."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import Run, Schedule
from tests.factories import RunFactory, ScheduleFactory, schedule_form_data

pytestmark = pytest.mark.pgbouncer

ADD_URL = reverse("admin:django_periodic_schedule_add")
LIST_URL = reverse("admin:django_periodic_schedule_changelist")


def change_url(schedule):
    return reverse("admin:django_periodic_schedule_change", args=[schedule.pk])


def act(client, action, *objects, url=LIST_URL):
    return client.post(
        url, {"action": action, "_selected_action": [o.pk for o in objects]}, follow=True
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- the form ----------------------------------------------------------------------------------


def test_a_schedule_created_in_the_admin_gets_its_cursor(admin_client):
    response = admin_client.post(ADD_URL, schedule_form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Schedule.objects.get(name="from-admin").next_fire_at is not None


def test_the_admin_names_the_wrong_cron_field(admin_client):
    response = admin_client.post(ADD_URL, schedule_form_data(cron="* 25 * * *"))
    errors = response.context["adminform"].form.errors
    assert errors["cron"] == ["Invalid hour field '25': 25 is out of range 0-23."]
    assert "Invalid hour field" in response.content.decode()
    assert not Schedule.objects.exists()


def test_the_admin_offers_only_registered_jobs(admin_client):
    response = admin_client.post(ADD_URL, schedule_form_data(job="tests.jobs.nope"))
    assert "job" in response.context["adminform"].form.errors
    page = admin_client.get(ADD_URL).content.decode()
    assert "tests.jobs.add — Adds two numbers." in page


def test_the_form_offers_the_three_trigger_kinds_and_every_time_zone(admin_client):
    page = admin_client.get(ADD_URL).content.decode()
    for kind in ("cron", "interval", "once"):
        assert f'name="trigger_kind" value="{kind}"' in page
    assert '<option value="Europe/Berlin">Europe/Berlin</option>' in page
    assert "django_periodic/schedule_form.js" in page
    assert "admin/js/vendor/select2/select2.full.js" in page


def test_an_interval_schedule_is_created_from_the_interval_kind(admin_client):
    data = schedule_form_data(trigger_kind="interval", interval="00:00:30")  # cron left behind
    assert admin_client.post(ADD_URL, data).status_code == 302
    schedule = Schedule.objects.get()
    assert (schedule.trigger_kind, schedule.interval) == ("interval", timedelta(seconds=30))


def test_a_code_defined_schedule_shows_its_trigger_read_only_with_its_location(admin_client):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *", defined_in="tests.jobs:42")
    page = admin_client.get(change_url(schedule))
    form = page.context["adminform"].form
    # Calendars are not @job options: the admin is where a code-defined schedule gets them;
    # the reason is its version's (docs/versions.md).
    assert set(form.fields) == {"enabled", "calendars", "on_closed_day", "version_reason"}
    html = page.content.decode()
    assert "Defined in code at <code>tests.jobs:42</code>" in html
    assert 'name="cron"' not in html
    assert "field-interval" not in html  # only the fields of its kind


def test_a_code_defined_schedule_can_still_be_paused(admin_client):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *", defined_in="tests.jobs:42")
    # "enabled" unchecked; its calendar fields as the page posts them
    response = admin_client.post(change_url(schedule), {"on_closed_day": "skip"})
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert schedule.cron == "0 3 * * *"


def test_a_code_defined_schedule_whose_job_is_gone_says_so_without_crashing(admin_client):
    schedule = ScheduleFactory(defined_in="tests.jobs:42")
    Schedule.objects.filter(pk=schedule.pk).update(job="tests.jobs.gone")
    response = admin_client.post(change_url(schedule), {})
    assert response.status_code == 200
    assert "job: No job named &#x27;tests.jobs.gone&#x27;" in response.content.decode()


def test_a_planning_error_is_shown_at_the_top_of_the_page_and_in_the_list(admin_client):
    schedule = ScheduleFactory()
    error = "Cannot plan: No job named 'tests.jobs.gone' is registered (with @job)."
    Schedule.objects.filter(pk=schedule.pk).update(last_error=error, planning_failures=3)
    page = admin_client.get(change_url(schedule)).content.decode()
    assert "could not be planned (3 ticks in a row)" in page
    assert "No job named &#x27;tests.jobs.gone&#x27;" in page
    listing = admin_client.get(LIST_URL).content.decode()
    assert 'class="periodic-error"' in listing
    assert "No job named &#x27;tests.jobs.gone&#x27;" in listing


# -- the list ----------------------------------------------------------------------------------


def test_the_list_shows_the_trigger_in_words_and_the_next_fire(admin_client):
    ScheduleFactory(name="nightly", interval=None, cron="0 3 * * *", timezone="Europe/Berlin")
    html = admin_client.get(LIST_URL).content.decode()
    assert "At 03:00" in html
    assert "Europe/Berlin" in html
    assert re.search(r'class="periodic-when" title="[^"]+ UTC">in ', html)


def test_the_list_shows_the_last_status_and_a_strip_of_the_last_20_runs(admin_client):
    schedule = ScheduleFactory()
    start = clock.now() - timedelta(hours=1)
    runs = [
        RunFactory(schedule=schedule, plan_time=start + timedelta(minutes=i), status="succeeded")
        for i in range(24)
    ]
    newest = RunFactory(schedule=schedule, plan_time=start + timedelta(minutes=30), status="failed")
    html = admin_client.get(LIST_URL).content.decode()
    assert html.count('class="periodic-square') == 20
    assert 'periodic-badge periodic-status-failed" title="">failed' not in html  # has a title
    assert 'class="periodic-badge periodic-status-failed"' in html
    run_url = reverse("admin:django_periodic_run_change", args=[newest.pk])
    assert f'href="{run_url}"' in html
    oldest_url = reverse("admin:django_periodic_run_change", args=[runs[0].pk])
    assert f'href="{oldest_url}"' not in html  # only the last 20


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"kind": "cron"}, {"cron", "code"}),
        ({"kind": "interval"}, {"interval"}),
        ({"kind": "once"}, {"once"}),
        ({"defined": "code"}, {"code"}),
        ({"defined": "admin"}, {"cron", "interval", "once"}),
        ({"last_status": "failed"}, {"interval"}),
        ({"last_status": "none"}, {"cron", "once", "code"}),
        ({"enabled__exact": "0"}, {"once"}),
        ({"q": "cro"}, {"cron"}),
    ],
)
def test_the_list_filters(admin_client, query, expected):
    ScheduleFactory(name="cron", interval=None, cron="0 3 * * *")
    failing = ScheduleFactory(name="interval")
    RunFactory(schedule=failing, status="succeeded", plan_time=clock.now() - timedelta(hours=1))
    RunFactory(schedule=failing, status="failed")
    ScheduleFactory(name="once", interval=None, run_at=clock.now(), enabled=False)
    ScheduleFactory(name="code", interval=None, cron="@daily", defined_in="tests.jobs:1")
    response = admin_client.get(LIST_URL, query)
    assert {s.name for s in response.context["cl"].result_list} == expected


# -- actions -----------------------------------------------------------------------------------


def test_run_now_action_records_a_manual_run(admin_client):
    schedule = ScheduleFactory()
    response = act(admin_client, "run_now", schedule)
    assert Run.objects.get(schedule=schedule).trigger == "manual"
    assert messages_of(response) == ["Requested 1 run: 1 pending."]


def test_run_now_goes_through_the_overlap_policy(admin_client):
    schedule = ScheduleFactory()
    RunFactory(schedule=schedule, status="running")
    response = act(admin_client, "run_now", schedule)
    manual = Run.objects.get(schedule=schedule, trigger="manual")
    assert (manual.status, manual.error_code) == ("skipped", "overlap")
    assert messages_of(response) == ["Requested 1 run: 1 skipped."]


def test_the_run_now_button_records_a_manual_run_and_links_to_it(admin_client):
    schedule = ScheduleFactory()
    url = reverse("admin:django_periodic_schedule_run_now", args=[schedule.pk])
    response = admin_client.post(url, follow=True)
    run = Run.objects.get(schedule=schedule)
    assert run.trigger == "manual"
    assert response.redirect_chain[-1][0] == change_url(schedule)
    run_url = reverse("admin:django_periodic_run_change", args=[run.pk])
    assert f'href="{run_url}"' in messages_of(response)[0]


def test_the_run_now_button_does_nothing_on_get(admin_client):
    schedule = ScheduleFactory()
    url = reverse("admin:django_periodic_schedule_run_now", args=[schedule.pk])
    assert admin_client.get(url).status_code == 405
    assert not Run.objects.exists()


def test_the_schedule_page_links_to_its_runs_and_offers_run_now(admin_client):
    schedule = ScheduleFactory()
    html = admin_client.get(change_url(schedule)).content.decode()
    runs_url = reverse("admin:django_periodic_run_changelist")
    assert f'href="{runs_url}?schedule={schedule.pk}"' in html
    assert reverse("admin:django_periodic_schedule_run_now", args=[schedule.pk]) in html


def test_disable_pauses_and_keeps_the_cursor(admin_client):
    schedule = ScheduleFactory()
    cursor = schedule.next_fire_at
    act(admin_client, "disable", schedule)
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_fire_at) == (False, cursor)


def test_enable_resumes_from_now_without_catch_up(admin_client):
    schedule = ScheduleFactory(interval=timedelta(minutes=1))
    past = clock.now() - timedelta(hours=2)
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False, next_fire_at=past)
    response = act(admin_client, "enable", schedule)
    schedule.refresh_from_db()
    assert schedule.enabled
    assert schedule.next_fire_at > clock.now() - timedelta(seconds=5)
    assert messages_of(response) == ["Resumed 1 schedule."]


def test_resume_with_catch_up_keeps_the_cursor_for_the_misfire_policy(admin_client):
    schedule = ScheduleFactory(interval=timedelta(minutes=1))
    past = clock.now() - timedelta(hours=2)
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False, next_fire_at=past)
    act(admin_client, "resume_with_catch_up", schedule)
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_fire_at) == (True, past)


def test_resume_with_catch_up_without_a_cursor_restarts_from_now(admin_client):
    schedule = ScheduleFactory(interval=timedelta(minutes=1))
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False, next_fire_at=None)
    act(admin_client, "resume_with_catch_up", schedule)
    schedule.refresh_from_db()
    assert schedule.enabled
    assert schedule.next_fire_at is not None


def test_enable_reports_a_schedule_whose_trigger_is_broken(admin_client):
    schedule = ScheduleFactory()
    broken = {"enabled": False, "interval": None, "cron": "0 3 * * *", "timezone": "Mars/Olympus"}
    Schedule.objects.filter(pk=schedule.pk).update(**broken)
    response = act(admin_client, "enable", schedule)
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "Unknown time zone 'Mars/Olympus'" in messages_of(response)[-1]


def test_resume_with_catch_up_leaves_a_broken_schedule_without_a_cursor_paused(admin_client):
    schedule = ScheduleFactory()
    broken = {"enabled": False, "next_fire_at": None, "interval": None, "cron": "0 99 * * *"}
    Schedule.objects.filter(pk=schedule.pk).update(**broken)
    response = act(admin_client, "resume_with_catch_up", schedule)
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "Invalid hour field '99'" in messages_of(response)[-1]


# -- fan-out -----------------------------------------------------------------------------------


def fanned_out(**fields):
    fields = {"job": "tests.jobs.per_tenant", "scopes": "tests.jobs.tenants", **fields}
    return ScheduleFactory(**fields)


def test_the_form_offers_the_registered_scope_providers(admin_client):
    page = admin_client.get(ADD_URL).content.decode()
    assert '<option value="tests.jobs.tenants">tests.jobs.tenants — The tenants' in page
    assert '<option value="tests.regions">' in page


def test_the_form_saves_a_fanned_out_schedule_and_refuses_an_unknown_provider(admin_client):
    data = schedule_form_data(job="tests.jobs.per_tenant", args="[]")
    response = admin_client.post(ADD_URL, {**data, "scopes": "billing.nope"})
    (message,) = response.context["adminform"].form.errors["scopes"]
    assert "No scope provider named 'billing.nope'" in message
    response = admin_client.post(ADD_URL, {**data, "scopes": "tests.regions"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Schedule.objects.get(name="from-admin").scopes == "tests.regions"


def test_a_fanned_out_schedule_page_shows_the_latest_run_of_each_scope_failing_first(
    admin_client,
):
    schedule = fanned_out()
    now = clock.now()
    for scope in ("acme", "globex", "initech"):
        RunFactory(schedule=schedule, scope=scope, plan_time=now - timedelta(hours=1),
                   status="failed")  # fmt: skip
    RunFactory(schedule=schedule, scope="acme", plan_time=now, status="succeeded")
    RunFactory(schedule=schedule, scope="initech", plan_time=now, status="succeeded")
    page = admin_client.get(change_url(schedule)).content.decode()
    assert "3 scopes: 1 failed, 2 succeeded." in page
    table = page[page.index('class="periodic-scopes"') :]
    assert table.index(">globex<") < table.index(">acme<") < table.index(">initech<")
    runs = reverse("admin:django_periodic_run_changelist")
    assert f'href="{runs}?schedule={schedule.pk}&amp;scope=globex"' in table


def test_the_scope_table_lists_twenty_scopes_and_counts_the_rest(admin_client):
    schedule = fanned_out()
    for k in range(25):
        RunFactory(schedule=schedule, scope=f"tenant-{k:02}", status="succeeded")
    page = admin_client.get(change_url(schedule)).content.decode()
    assert "25 scopes: 25 succeeded." in page
    assert ">tenant-19<" in page and ">tenant-20<" not in page
    assert "5 more scopes" in page


def test_an_unscoped_schedule_page_has_no_scope_table(admin_client):
    page = admin_client.get(change_url(ScheduleFactory())).content.decode()
    assert "periodic-scopes" not in page and "no scoped run yet" not in page


def test_run_now_on_a_fanned_out_schedule_runs_every_scope(admin_client):
    schedule = fanned_out()
    response = act(admin_client, "run_now", schedule)
    runs = Run.objects.filter(schedule=schedule, trigger="manual")
    assert sorted(runs.values_list("scope", flat=True)) == ["7", "acme", "globex"]
    assert messages_of(response) == ["Requested 3 runs: 3 pending."]


def test_run_now_reports_a_failing_scope_provider(admin_client, monkeypatch):
    from tests import jobs

    monkeypatch.setattr(jobs, "TENANTS", RuntimeError("accounts service down"))
    schedule = fanned_out()
    url = reverse("admin:django_periodic_schedule_run_now", args=[schedule.pk])
    response = admin_client.post(url, follow=True)
    assert not Run.objects.exists()
    assert "its scope provider failed: accounts service down" in messages_of(response)[0]
