"""The admin's overview page with 10,000 schedules and 1,000,000 runs, on PostgreSQL.

    PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL=postgres://... \\
        python benchmarks/overview.py [--schedules N] [--runs N] [--repeat N] [--quick]

Seeds N schedules in bulk (hourly intervals, one in a hundred needing attention, one in a
thousand late), then the runs set-based (INSERT ... SELECT generate_series), a hundred per
schedule over the last week, one in fifty failed, about 100 runs started per minute, the
newest twenty running; each run with its lease (released, but for the running ones). Then
renders the page through Django's test client as a logged-in superuser, ``--repeat`` times,
and prints Markdown rows (bench.py's columns):

- **overview page**: its queries and the median time of a render, first page and last;
- **the same SQL, bare**: the page's statements run again on one cursor without Django
  (the floor: what the database alone takes), and whether any plan reads the runs or the
  leases table by a sequential scan (EXPLAIN of each statement: the page must use existing
  indexes).
"""

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402

from django_periodic.db import clock  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402

RUN_TABLE = Run._meta.db_table
# The tables that grow with the history: no statement of the page may scan them whole.
HISTORY_TABLES = (RUN_TABLE, Lease._meta.db_table)

# Run i belongs to schedule i mod N and is planned (i div N) * STEP before now, offset by
# its schedule's place within a step: N runs per STEP, spread evenly.
INSERT_RUNS = f"""
    INSERT INTO {RUN_TABLE} (
        schedule_id, plan_time, "trigger", status, attempt, max_attempts, interruptions,
        exclusive, started_at, finished_at, duration, result, error_code, error_message,
        traceback, job_name, args, kwargs, created_at, scope, tasks_backend, task_id
    )
    SELECT s.ids[1 + i %% n], t.plan_time, 'schedule',
        CASE WHEN i < 20 THEN 'running' WHEN i %% 50 = 3 THEN 'failed' ELSE 'succeeded' END,
        1, 1, 0, true, t.plan_time + t.lag,
        CASE WHEN i >= 20 THEN t.plan_time + t.lag + t.took END,
        CASE WHEN i >= 20 THEN t.took END, 'null',
        CASE WHEN i %% 50 = 3 AND i >= 20 THEN 'RuntimeError' ELSE '' END,
        CASE WHEN i %% 50 = 3 AND i >= 20 THEN 'bench failure' ELSE '' END,
        '', 'tests.jobs.noop', '[]', '{{}}', t.plan_time, '', '', ''
    FROM generate_series(0, %(runs)s - 1) AS i
    CROSS JOIN (SELECT array_agg(id ORDER BY id) AS ids, count(*) AS n
                FROM {Schedule._meta.db_table}) AS s
    CROSS JOIN LATERAL (
        SELECT %(now)s - (i / s.n) * %(step)s - (i %% s.n) * (%(step)s / s.n)
                - interval '1 second' AS plan_time,
            (random() * random() * 3000) * interval '1 millisecond' AS lag,
            (random() * 2000) * interval '1 millisecond' AS took
    ) AS t
"""

# Each run's lease: released with its outcome for a finished run, held for a running one
# (the held ones found through their partial index among a million released).
INSERT_LEASES = f"""
    INSERT INTO {Lease._meta.db_table} (
        run_id, attempt, token, holder, process_id, acquired_at, heartbeat_at, expires_at,
        released_at, outcome
    )
    SELECT id, 1, gen_random_uuid(), 'bench:1', %(process)s, started_at,
        coalesce(finished_at, %(now)s), coalesce(finished_at, %(now)s) + interval '60 seconds',
        finished_at, CASE WHEN finished_at IS NULL THEN '' ELSE status END
    FROM {RUN_TABLE}
"""

TABLES = (Lease, Run, Schedule, SchedulerProcess)


def reset() -> None:
    names = ", ".join(model._meta.db_table for model in TABLES)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def seed(schedules: int, runs: int) -> float:
    """The rows; returns the seconds the seeding took."""
    reset()
    started = time.perf_counter()
    now = clock.now()
    process = SchedulerProcess.objects.create(host="bench", pid=1, started_at=now, heartbeat_at=now)
    Schedule.objects.bulk_create(
        (
            Schedule(
                name=f"overview-{k:05d}",
                job="tests.jobs.noop",
                interval=timedelta(hours=1),
                start_at=now - timedelta(days=30),
                # One in a thousand late (its cursor two hours past), one in a hundred
                # needing attention.
                next_fire_at=now + timedelta(minutes=k % 60)
                if k % 1000
                else now - timedelta(hours=2),
                attention_reason="failing" if k % 100 == 7 else "",
                attention_since=now - timedelta(hours=3) if k % 100 == 7 else None,
                alert_failures=3 if k % 100 == 7 else None,
            )
            for k in range(schedules)
        ),
        batch_size=5_000,
    )
    # A hundred runs per schedule over about a week: each schedule's every 100 minutes.
    step = timedelta(minutes=10_000 / max(runs // schedules, 1))
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, {"now": now, "runs": runs, "step": step})
        cursor.execute(INSERT_LEASES, {"now": now, "process": process.pk})
        for model in TABLES:
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")
    return time.perf_counter() - started


def render(client: Client, url: str, repeat: int) -> tuple[float, list[str]]:
    """The median milliseconds of a render, and the statements of one."""
    client.get(url)  # warm: the session, content types, templates
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    return statistics.median(took), [query["sql"] for query in captured]


def bare(statements: list[str], repeat: int) -> tuple[float, list[str]]:
    """The median milliseconds of the statements alone on one cursor, and those whose plan
    reads the runs or the leases table sequentially."""
    took = []
    with connection.cursor() as cursor:
        for _ in range(repeat):
            started = time.perf_counter()
            for sql in statements:
                cursor.execute(sql)
                if cursor.description:
                    cursor.fetchall()
            took.append((time.perf_counter() - started) * 1000)
        scanning = []
        for sql in statements:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            if any(f"Seq Scan on {table}" in plan for table in HISTORY_TABLES):
                scanning.append(sql[:120])
    return statistics.median(took), scanning


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1,000 schedules, 100,000 runs")
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("benchmarks/overview.py seeds with PostgreSQL SQL (PERIODIC_TEST_DB=postgres).")
    call_command("migrate", verbosity=0)
    schedules = 1_000 if options.quick else options.schedules
    runs = 100_000 if options.quick else options.runs
    seeded = seed(schedules, runs)
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:django_periodic_schedule_overview")
    last = f"{url}?page={-(-schedules // 50)}"
    rows = []
    for name, address in (("first page", url), ("last page", last)):
        median, statements = render(client, address, options.repeat)
        floor, scanning = bare(statements, options.repeat)
        rows.append(
            {
                "what": f"overview page, {name}: {schedules:,} schedules, {runs:,} runs",
                "result": f"{median:.0f} ms, {len(statements)} queries",
                "detail": f"median of {options.repeat}; the same SQL bare: {floor:.0f} ms; "
                f"sequential scans of runs or leases: {len(scanning) or 'none'}",
            }
        )
        for sql in scanning:
            print(f"sequential scan of runs or leases in: {sql}", file=sys.stderr)
    reset()
    user.delete()
    print(f"\n## The overview page, Django {django.get_version()} (seeded in {seeded:.0f} s)\n")
    print("| measured | result | detail |\n|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['result']} | {row['detail']} |")


if __name__ == "__main__":
    main()
