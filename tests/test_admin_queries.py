"""The admin's lists cost a constant number of queries however many rows they show."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic.admin import history
from django_periodic.db import clock
from django_periodic.models import Lease, Run, Schedule
from tests.factories import LeaseFactory, ScheduleFactory, SchedulerProcessFactory

RUNS_EACH = 25  # more than the strip shows


def add_schedules(count: int, runs_each: int = RUNS_EACH) -> list[Schedule]:
    """Schedules with a history of runs, each run with a lease (in bulk, to stay quick)."""
    start = Schedule.objects.count()
    schedules = [ScheduleFactory(name=f"s{start + i:05d}") for i in range(count)]
    now = clock.now()
    process = SchedulerProcessFactory(started_at=now)
    statuses = ["succeeded", "failed", "skipped", "running"]
    runs = Run.objects.bulk_create(
        Run(
            schedule=schedule,
            plan_time=now - timedelta(minutes=i),
            status=statuses[i % len(statuses)] if i else "succeeded",
            exclusive=False,  # several "running" rows per schedule
            job_name=schedule.job,
            started_at=now - timedelta(minutes=i),
            duration=timedelta(seconds=1),
        )
        for schedule in schedules
        for i in range(runs_each)
    )
    Lease.objects.bulk_create(
        LeaseFactory.build(run=run, process=process, acquired_at=now) for run in runs
    )
    return schedules


def queries(client, url: str, **params) -> int:
    client.get(url, params)  # warm caches (content types, the session) first
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, params)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize(
    ("url", "params"),
    [
        ("admin:django_periodic_schedule_changelist", {}),
        ("admin:django_periodic_schedule_changelist", {"last_status": "failed"}),
        ("admin:django_periodic_run_changelist", {}),
        ("admin:django_periodic_run_changelist", {"status__exact": "failed"}),
        ("admin:django_periodic_lease_changelist", {}),
        ("admin:django_periodic_schedulerprocess_changelist", {}),
    ],
)
def test_a_list_costs_the_same_queries_for_3_rows_as_for_60(admin_client, url, params):
    url = reverse(url)
    add_schedules(3, runs_each=3)
    few = queries(admin_client, url, **params)
    add_schedules(57)
    many = queries(admin_client, url, **params)
    assert many == few


def test_the_schedule_page_costs_the_same_queries_with_a_long_history(admin_client):
    schedule = add_schedules(1, runs_each=2)[0]
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    few = queries(admin_client, url)
    Run.objects.filter(schedule=schedule).delete()
    Run.objects.bulk_create(
        Run(schedule=schedule, plan_time=clock.now() - timedelta(minutes=i), status="succeeded")
        for i in range(300)
    )
    assert queries(admin_client, url) == few


def test_the_run_page_costs_the_same_queries_with_many_leases(admin_client):
    schedule = add_schedules(1, runs_each=1)[0]
    run = schedule.runs.get()
    url = reverse("admin:django_periodic_run_change", args=[run.pk])
    few = queries(admin_client, url)
    lease = run.leases.get()
    Lease.objects.bulk_create(
        LeaseFactory.build(
            run=run, attempt=attempt, process=lease.process, acquired_at=lease.acquired_at
        )
        for attempt in range(2, 12)
    )
    assert queries(admin_client, url) == few


def test_the_strip_is_one_query_for_the_whole_page(db):
    schedules = add_schedules(30)
    with CaptureQueriesContext(connection) as captured:
        runs = history.recent_runs([s.pk for s in schedules])
    assert len(captured) == 1
    assert {len(r) for r in runs.values()} == {history.STRIP_LENGTH}


def test_the_strip_holds_each_schedules_newest_runs_newest_first(db):
    first, second = add_schedules(2)
    runs = history.recent_runs([first.pk, second.pk, 999999], limit=5)
    assert set(runs) == {first.pk, second.pk}
    expected = list(first.runs.order_by("-plan_time", "-pk").values_list("pk", flat=True)[:5])
    assert [run.pk for run in runs[first.pk]] == expected
    assert all(run.schedule_id == second.pk for run in runs[second.pk])


def test_the_strip_reads_only_the_newest_rows_on_postgresql(postgres):
    schedules = add_schedules(3, runs_each=300)
    with CaptureQueriesContext(connection) as captured:
        history.recent_runs([s.pk for s in schedules])
    (sql,) = (query["sql"] for query in captured.captured_queries)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_periodic_run")
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # A LIMIT per schedule over the history index: never every run of a schedule.
    scan = "Index Scan using periodic_run_history"
    assert "Nested Loop" in plan and scan in plan, plan
    assert plan.index("Limit") < plan.index(scan), plan  # the LIMIT sits above each scan
    assert "Seq Scan on django_periodic_run" not in plan, plan
