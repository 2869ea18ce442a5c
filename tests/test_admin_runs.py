"""Runs, leases and scheduler processes in the admin."""

from datetime import timedelta

import pytest
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import Run, SchedulerProcess
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import run_url

LIST_URL = reverse("admin:django_periodic_run_changelist")
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad value'
PROCESSES_URL = reverse("admin:django_periodic_schedulerprocess_changelist")


def failed_run(**fields):
    now = clock.now()
    values = {
        "status": "failed",
        "attempt": 2,
        "max_attempts": 3,
        "plan_time": now - timedelta(seconds=10),
        "started_at": now - timedelta(seconds=8),
        "finished_at": now - timedelta(seconds=5),
        "duration": timedelta(seconds=3),
        "error_code": "ValueError",
        "error_message": "bad value",
        "traceback": TRACEBACK,
    }
    return RunFactory(**{**values, **fields})


def test_the_run_list_shows_status_attempts_timing_and_holder(admin_client, process):
    run = failed_run()
    LeaseFactory(run=run, process=process, attempt=1, outcome="retry")
    LeaseFactory(run=run, process=process, attempt=2, outcome="failed")
    html = admin_client.get(LIST_URL).content.decode()
    assert 'class="periodic-badge periodic-status-failed"' in html
    assert "2 / 3" in html
    assert "3.0 s" in html  # duration
    assert "2.0 s" in html  # lag: started two seconds after its plan time
    assert "test:1" in html  # the holder of the last lease
    assert html.count(run_url(run)) == 1


def test_the_run_list_is_titled_runs_and_offers_no_add(admin_client):
    response = admin_client.get(LIST_URL)
    assert response.context["title"] == "Runs"
    assert admin_client.get(reverse("admin:django_periodic_run_add")).status_code == 403


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status__exact": "failed"}, {"first"}),
        ({"trigger__exact": "manual"}, {"other"}),
        ({"q": "disk full"}, {"first"}),
        ({"q": "other"}, {"other"}),
    ],
)
def test_the_run_list_filters_and_searches(admin_client, query, expected):
    failed_run(error_message="disk full", schedule=ScheduleFactory(name="first"))
    RunFactory(trigger="manual", schedule=ScheduleFactory(name="other"))
    response = admin_client.get(LIST_URL, query)
    assert {r.schedule.name for r in response.context["cl"].result_list} == expected


def test_the_run_list_shows_the_latest_plan_time_first(admin_client):
    schedule = ScheduleFactory()
    now = clock.now()
    newer = RunFactory(schedule=schedule, plan_time=now, status="failed")
    older = RunFactory(schedule=schedule, plan_time=now - timedelta(hours=1), status="failed")
    retry = RunFactory(schedule=schedule, plan_time=older.plan_time, trigger="retry")
    for query in ({}, {"schedule": schedule.pk}):
        listed = admin_client.get(LIST_URL, query).context["cl"].result_list
        assert [run.pk for run in listed] == [newer.pk, retry.pk, older.pk]


def test_the_run_list_filters_by_schedule(admin_client):
    mine, other = ScheduleFactory(), ScheduleFactory()
    RunFactory(schedule=mine)
    RunFactory(schedule=other)
    response = admin_client.get(LIST_URL, {"schedule": mine.pk})
    assert [r.schedule_id for r in response.context["cl"].result_list] == [mine.pk]


def test_the_run_page_shows_the_error_traceback_snapshot_and_leases(admin_client, process):
    run = failed_run(args=[1, "two"], kwargs={"key": "value"})
    LeaseFactory(run=run, process=process, attempt=1, outcome="retry", released_at=clock.now())
    LeaseFactory(run=run, process=process, attempt=2, outcome="failed", released_at=clock.now())
    html = admin_client.get(run_url(run)).content.decode()
    assert "ValueError" in html
    assert "bad value" in html
    assert '<pre class="periodic-pre">Traceback (most recent call last):' in html
    assert "[\n  1,\n  &quot;two&quot;\n]" in html
    assert "&quot;key&quot;: &quot;value&quot;" in html
    assert html.count('class="form-row has_original') == 2  # the two leases inline
    assert '<div class="readonly">test:1</div>' in html  # the holder
    assert "retry" in html and "failed" in html
    assert 'name="error_message"' not in html  # nothing to edit


def test_the_run_page_shows_the_result_as_pretty_json(admin_client):
    run = RunFactory(status="succeeded", result={"deleted": 3, "tables": ["a", "b"]})
    html = admin_client.get(run_url(run)).content.decode()
    assert "&quot;deleted&quot;: 3" in html
    assert "&quot;tables&quot;: [\n    &quot;a&quot;," in html


def test_retry_action_records_a_new_run_for_each_failed_one(admin_client):
    run = failed_run()
    succeeded = RunFactory(status="succeeded")
    response = admin_client.post(
        LIST_URL, {"action": "retry", "_selected_action": [run.pk, succeeded.pk]}, follow=True
    )
    retry = Run.objects.get(trigger="retry")
    assert (retry.schedule, retry.plan_time, retry.status) == (
        run.schedule,
        run.plan_time,
        "pending",
    )
    assert [str(m) for m in response.context["messages"]] == ["Retried 1 failed run: 1 pending."]


def test_the_retry_button_opens_the_new_run(admin_client):
    run = failed_run()
    response = admin_client.post(run_url(run, "retry"), follow=True)
    retry = Run.objects.get(trigger="retry")
    assert response.redirect_chain[-1][0] == run_url(retry)


def test_only_a_failed_run_is_retried_by_its_button(admin_client):
    run = RunFactory(status="succeeded")
    response = admin_client.post(run_url(run, "retry"), follow=True)
    assert not Run.objects.filter(trigger="retry").exists()
    assert "Only a failed run can be retried." in response.content.decode()


def test_the_run_page_offers_retry_for_a_failed_run_and_cancel_for_a_waiting_one(admin_client):
    failed, pending = failed_run(), RunFactory(status="pending")
    failed_html = admin_client.get(run_url(failed)).content.decode()
    assert run_url(failed, "retry") in failed_html
    assert run_url(failed, "cancel") not in failed_html
    pending_html = admin_client.get(run_url(pending)).content.decode()
    assert run_url(pending, "cancel") in pending_html
    assert run_url(pending, "retry") not in pending_html


def test_cancel_action_cancels_waiting_runs_and_asks_running_ones_to_stop(admin_client):
    pending = RunFactory(status="pending")
    running = RunFactory(status="running")
    done = RunFactory(status="succeeded")
    selected = [pending.pk, running.pk, done.pk]
    response = admin_client.post(
        LIST_URL, {"action": "cancel", "_selected_action": selected}, follow=True
    )
    pending.refresh_from_db()
    running.refresh_from_db()
    done.refresh_from_db()
    assert pending.status == "cancelled"
    assert (running.status, running.cancel_requested_at is not None) == ("running", True)
    assert done.status == "succeeded"
    message = "Cancelled: 1. Asked to stop (running): 1."
    assert [str(m) for m in response.context["messages"]] == [message]


def test_the_cancel_button_asks_a_running_run_to_stop(admin_client):
    running = RunFactory(status="running")
    assert "Ask to stop" in admin_client.get(run_url(running)).content.decode()
    response = admin_client.post(run_url(running, "cancel"), follow=True)
    running.refresh_from_db()
    assert running.cancel_requested_at is not None
    assert "Asked the running job to stop." in response.content.decode()


def test_the_buttons_only_answer_post(admin_client):
    run = failed_run()
    assert admin_client.get(run_url(run, "retry")).status_code == 405
    assert admin_client.get(run_url(run, "cancel")).status_code == 405


def test_the_schedulers_page_marks_stale_processes_and_counts_runs_held(admin_client):
    now = clock.now()
    alive = SchedulerProcessFactory(started_at=now)
    stale = SchedulerProcessFactory(
        started_at=now - SchedulerProcess.stale_after() - timedelta(seconds=1)
    )
    LeaseFactory(process=alive)
    LeaseFactory(process=alive)
    LeaseFactory(run__status="succeeded", process=alive, released_at=now)
    response = admin_client.get(PROCESSES_URL)
    assert response.context["title"] == "Schedulers"
    html = response.content.decode()
    assert 'periodic-status-succeeded" title="alive">alive' in html
    assert ">stale</span>" in html
    rows = {p.pk: p for p in response.context["cl"].result_list}
    assert (rows[alive.pk].held, rows[stale.pk].held) == (2, 0)
    leases_url = reverse("admin:django_periodic_lease_changelist")
    held_link = f"{leases_url}?process__id__exact={alive.pk}&amp;released_at__isnull=True"
    assert held_link in html


def test_the_schedulers_page_shows_the_jobs_each_process_has(admin_client):
    now = clock.now()
    SchedulerProcessFactory(started_at=now, jobs=["tests.jobs.noop", "tests.jobs.add"])
    SchedulerProcessFactory(started_at=now, jobs=None)  # a release that does not say
    html = admin_client.get(PROCESSES_URL).content.decode()
    assert '<span title="tests.jobs.add\ntests.jobs.noop">2</span>' in html
    assert "not stated" in html


def test_the_leases_of_a_process_are_listed_from_its_link(admin_client, process):
    LeaseFactory(process=process)
    LeaseFactory(run__status="succeeded", process=process, released_at=clock.now())
    url = reverse("admin:django_periodic_lease_changelist")
    query = {"process__id__exact": process.pk, "released_at__isnull": "True"}
    response = admin_client.get(url, query)
    assert len(response.context["cl"].result_list) == 1


def test_runs_are_filtered_and_searched_by_scope(admin_client):
    schedule = ScheduleFactory(job="tests.jobs.per_tenant", scopes="tests.jobs.tenants")
    acme = RunFactory(schedule=schedule, scope="acme")
    RunFactory(schedule=schedule, scope="globex")
    unscoped = RunFactory()

    def listed(query):
        response = admin_client.get(LIST_URL, query)
        return {run.pk for run in response.context["cl"].result_list}

    assert listed({"scope": "acme"}) == {acme.pk}
    assert listed({"scope": "-"}) == {unscoped.pk}
    assert listed({"q": "acme"}) == {acme.pk}
    page = admin_client.get(run_url(acme)).content.decode()
    assert ">acme<" in page
