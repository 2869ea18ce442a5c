"""The admin's overview page: each section shows the rows it is about, the charts count and
measure what the rows say, the page costs a constant number of queries, and only those who
may view schedules and runs see it."""

import re
import statistics
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic.admin.overview import sections
from django_periodic.db import clock
from django_periodic.engine.records import truncated
from django_periodic.models import Run, Schedule
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory
from tests.helpers import overdue_schedule

URL = reverse("admin:django_periodic_schedule_overview")


def page(client, **params) -> str:
    response = client.get(URL, params)
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, name: str) -> str:
    """The HTML of the page's section ``overview-<name>``."""
    found = re.search(rf'<section id="overview-{name}".*?</section>', html, re.S)
    assert found, name
    return found.group(0)


def row_of(html: str, name: str) -> str:
    """The row of the schedule ``name`` in the page's list of schedules."""
    (row,) = [row for row in section(html, "schedules").split("<tr>") if f">{name}</a>" in row]
    return row


def staff(client, *codenames: str):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def started_run(schedule: Schedule, started_at, lag=timedelta(seconds=1), **fields) -> Run:
    fields = {"status": "succeeded", "attempt": 1, "duration": timedelta(seconds=2), **fields}
    return RunFactory(
        schedule=schedule, plan_time=started_at - lag, started_at=started_at, **fields
    )


# -- the sections: the rows they are about ----------------------------------------------------


def test_a_running_run_is_in_running_now_and_an_ended_one_is_not(admin_client):
    now = clock.now()
    lease = LeaseFactory(
        run__schedule=ScheduleFactory(name="long import"), run__started_at=now, run__scope="acme"
    )
    started_run(ScheduleFactory(name="quick one"), now - timedelta(minutes=1))
    running = section(page(admin_client), "running")
    assert f"#{lease.run.pk}" in running
    assert "long import" in running and "acme" in running and lease.holder in running
    assert "quick one" not in running


def test_a_failed_run_is_in_failed_with_its_code_and_a_succeeded_one_is_not(admin_client):
    now = clock.now()
    failed = started_run(
        ScheduleFactory(name="export"), now - timedelta(hours=2), status="failed",
        error_code="ConnectionError", error_message="partner down",
    )  # fmt: skip
    started_run(ScheduleFactory(name="fine"), now - timedelta(hours=1))
    shown = section(page(admin_client), "failed")
    assert f"#{failed.pk}" in shown and "ConnectionError" in shown and "partner down" in shown
    assert "fine" not in shown


def test_a_failed_run_of_a_fire_older_than_a_day_is_not_listed(admin_client):
    started_run(ScheduleFactory(name="old"), clock.now() - timedelta(days=2), status="failed")
    assert "No failed run." in section(page(admin_client), "failed")


def test_a_schedule_due_past_a_scheduler_s_slack_is_late_and_one_just_due_is_not(admin_client):
    now = clock.now()
    overdue_schedule(now, name="stuck report")
    just_due = ScheduleFactory(name="just due")
    Schedule.objects.filter(pk=just_due.pk).update(next_fire_at=now)
    late = section(page(admin_client), "late")
    assert "stuck report" in late and "just due" not in late


def test_a_schedule_needing_attention_is_named_and_listed_first(admin_client):
    ScheduleFactory(name="aaa fine")
    troubled = ScheduleFactory(name="zzz troubled", alert_failures=2)
    Schedule.objects.filter(pk=troubled.pk).update(
        attention_reason="failing", attention_since=clock.now()
    )
    html = page(admin_client)
    attention = section(html, "attention")
    assert "zzz troubled" in attention and "/schedule/?q=zzz%20troubled" in attention
    schedules = section(html, "schedules")
    assert schedules.index("zzz troubled") < schedules.index("aaa fine")


# -- the strips: the last 50 runs, with their durations ---------------------------------------


def test_the_strip_shows_the_newest_50_runs_each_linked_with_its_duration(admin_client):
    now = clock.now()
    schedule = ScheduleFactory(name="busy")
    runs = [
        started_run(schedule, now - timedelta(minutes=m), duration=timedelta(seconds=m))
        for m in range(1, 61)
    ]
    strip = section(page(admin_client), "schedules")
    linked = {int(pk) for pk in re.findall(r'/run/(\d+)/change/"><rect', strip)}
    assert linked == {run.pk for run in runs[:50]}
    # Each cell's tooltip gives its duration: the 7th newest ran 7 s.
    assert re.search(rf"#{runs[6].pk} · succeeded · [^<]* · 7\.0 s</title>", strip)


def test_a_longer_run_draws_a_taller_cell(admin_client):
    now = clock.now()
    schedule = ScheduleFactory(name="uneven")
    short = started_run(schedule, now - timedelta(minutes=2), duration=timedelta(seconds=1))
    long = started_run(schedule, now - timedelta(minutes=1), duration=timedelta(seconds=100))
    strip = section(page(admin_client), "schedules")

    def height(run: Run) -> float:
        found = re.search(rf'/run/{run.pk}/change/"><rect [^>]* height="([\d.]+)"', strip)
        assert found
        return float(found.group(1))

    assert height(long) > height(short)


def test_the_page_pages_through_the_schedules_50_at_a_time(admin_client):
    ScheduleFactory.create_batch(53)
    first = section(page(admin_client), "schedules")
    second = section(page(admin_client, page=2), "schedules")
    linked = r"/schedule/\d+/change/"
    assert (len(re.findall(linked, first)), len(re.findall(linked, second))) == (50, 3)
    assert "page 2 of 2" in second


# -- the timeline: the next 24 hours of fires -------------------------------------------------


def test_the_timeline_has_a_tick_for_each_hourly_fire_of_the_next_24_hours(admin_client):
    now = clock.now()
    ScheduleFactory(name="hourly", interval=None, cron="0 * * * *", timezone="UTC")
    ticks = section(page(admin_client), "schedules").count('class="periodic-fire"')
    # The hours strictly after now and before now + 24 h, counted without the trigger code.
    hours = [truncated(now, "hour") + timedelta(hours=h) for h in range(1, 25)]
    assert ticks == sum(1 for hour in hours if now < hour < now + timedelta(hours=24))


def test_a_per_minute_schedule_s_timeline_is_bounded_and_says_there_are_more(admin_client):
    ScheduleFactory(name="every minute", interval=None, cron="* * * * *", timezone="UTC")
    shown = section(page(admin_client), "schedules")
    assert shown.count('class="periodic-fire"') == sections.TIMELINE_FIRES
    assert 'class="periodic-fire-band"' in shown


def test_a_disabled_schedule_has_no_fires_and_says_why(admin_client):
    ScheduleFactory(name="off", enabled=False)
    shown = section(page(admin_client), "schedules")
    assert 'class="periodic-fire"' not in shown and "disabled" in shown


@pytest.mark.parametrize("stored", [{"cron": "61 * * * *"}, {"timezone": "Mars/Olympus"}])
def test_a_row_stored_past_validation_says_why_and_the_page_still_shows(admin_client, stored):
    broken = ScheduleFactory(name="broken", interval=None, cron="0 * * * *")
    Schedule.objects.filter(pk=broken.pk).update(**stored)  # raw, past clean()
    ScheduleFactory(name="healthy", interval=None, cron="0 * * * *", timezone="UTC")
    html = page(admin_client)
    assert "invalid:" in row_of(html, "broken")
    assert 'class="periodic-fire"' in row_of(html, "healthy")


# -- the series: runs per minute and the lag's percentiles ------------------------------------


def test_runs_per_minute_count_the_runs_started_in_each_minute(db):
    now = clock.now()
    schedule = ScheduleFactory()
    minutes = (1, 1, 5, 5, 5, 30)
    started = [now - timedelta(minutes=m, seconds=i) for i, m in enumerate(minutes)]
    for at in started:
        started_run(schedule, at, exclusive=False)
    started_run(schedule, now - timedelta(hours=2))  # before the window
    series = sections.series(now, "hour", "default")
    expected = Counter(truncated(at, "minute") for at in started)
    assert {s: n for s, n in zip(series.starts, series.runs, strict=True) if n} == expected
    assert len(series.starts) == 60 and series.total == len(started)


def test_lag_percentiles_agree_with_python_s_statistics_on_the_same_rows(db):
    now = clock.now()
    schedule = ScheduleFactory()
    minute = truncated(now, "minute") - timedelta(minutes=3)
    lags = [0.05, 0.2, 0.3, 1.5, 2.0, 2.25, 7.0, 11.0, 40.0, 95.5]
    for i, lag in enumerate(lags):
        started_run(schedule, minute + timedelta(seconds=i), lag=timedelta(seconds=lag))
    # Neither a retry's start nor a backfilled run's says how prompt the scheduler is.
    started_run(schedule, minute + timedelta(seconds=20), lag=timedelta(hours=1, minutes=-1),
                attempt=2)  # fmt: skip
    started_run(schedule, minute + timedelta(seconds=21), lag=timedelta(minutes=50),
                trigger=Run.Trigger.BACKFILL)  # fmt: skip
    series = sections.series(now, "hour", "default")
    at = series.starts.index(minute)
    assert series.runs[at] == len(lags) + 2
    p99 = statistics.quantiles(lags, n=100, method="inclusive")[98]  # percentile_cont's rule
    assert series.p50[at].total_seconds() == pytest.approx(statistics.median(lags))
    assert series.p99[at].total_seconds() == pytest.approx(p99)


def test_the_day_s_series_has_an_hourly_bucket_for_each_of_24_hours(db):
    now = clock.now()
    started_run(ScheduleFactory(), now - timedelta(hours=5))
    series = sections.series(now, "day", "default")
    assert len(series.starts) == 24
    assert series.runs[series.starts.index(truncated(now - timedelta(hours=5), "hour"))] == 1


def test_the_charts_are_titled_svg_with_a_tooltip_per_bar(admin_client):
    started_run(ScheduleFactory(), clock.now() - timedelta(minutes=2))
    charts = section(page(admin_client), "charts")
    for title in ("Start lag, last hour", "Runs per minute, last hour", "Start lag, last day"):
        assert title in charts
    assert charts.count('class="periodic-chart-bar"') == 60 + 24
    assert "1 runs (1.0/min)</title>" in charts


# -- cost: a constant number of queries -------------------------------------------------------


def add_history(count: int, runs_each: int) -> None:
    """``count`` schedules with runs of every kind the page reads: running (with a lease),
    failed, succeeded; one needing attention, one late."""
    now = clock.now()
    start = Schedule.objects.count()
    schedules = [ScheduleFactory(name=f"h{start + i:04d}") for i in range(count)]
    Run.objects.bulk_create(
        Run(schedule=s, plan_time=now - timedelta(minutes=m + 1), exclusive=False,
            status="failed" if m % 4 == 0 else "succeeded", attempt=1, job_name=s.job,
            started_at=now - timedelta(minutes=m), duration=timedelta(seconds=m))
        for s in schedules
        for m in range(runs_each)
    )  # fmt: skip
    for s in schedules[:2]:
        LeaseFactory(run__schedule=s, run__started_at=now, run__exclusive=False)
    Schedule.objects.filter(pk=schedules[0].pk).update(attention_reason="failing")
    overdue_schedule(now, name=f"late{start}")


def queries(client) -> int:
    page(client)  # warm caches (content types, the session) first
    with CaptureQueriesContext(connection) as captured:
        page(client)
    return len(captured)


def test_the_page_costs_the_same_queries_for_3_schedules_as_for_120(admin_client):
    add_history(3, runs_each=3)
    few = queries(admin_client)
    add_history(117, runs_each=60)
    assert queries(admin_client) == few


# -- who may see it -----------------------------------------------------------------------------


def test_a_viewer_of_schedules_and_runs_sees_it_and_its_link(client, db):
    staff(client, "view_schedule", "view_run")
    assert "Running now" in page(client)
    index = client.get(reverse("admin:app_list", args=["django_periodic"])).content.decode()
    assert URL in index
    changelist = client.get(reverse("admin:django_periodic_schedule_changelist"))
    assert URL in changelist.content.decode()


@pytest.mark.parametrize("codenames", [(), ("view_schedule",), ("view_run",)])
def test_without_view_permission_on_schedules_and_runs_it_is_forbidden(client, db, codenames):
    staff(client, *codenames)
    assert client.get(URL).status_code == 403


def test_the_app_index_hides_the_link_from_who_may_not_see_it(client, db):
    staff(client, "view_schedule", "view_lease")
    index = client.get(reverse("admin:app_list", args=["django_periodic"]))
    assert URL not in index.content.decode()


def test_an_anonymous_visitor_is_sent_to_log_in(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and "login" in response["Location"]
