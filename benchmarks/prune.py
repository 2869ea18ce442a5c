"""Time prune_runs on a million finished runs and show that its memory stays bounded.

    bash benchmarks/run.sh            # after bench.py, on the PostgreSQL server only
    PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL=postgres://... \\
        python benchmarks/prune.py [--runs N | --quick] [--batch-size N]

Inserts N finished runs with one lease each, spread over a few schedules, set-based
(INSERT ... SELECT generate_series), then times ``call_command("prune_runs", days=0)`` and
prints one Markdown row (the columns of bench.py's table): runs deleted, runs per second,
and the process's peak RSS before and after pruning. The runs never pass through Python
while seeding, so any growth of the peak is prune_runs' own.
"""

import argparse
import os
import resource
import sys
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_periodic.db import clock  # noqa: E402
from django_periodic.management.commands.prune_runs import DEFAULT_BATCH_SIZE  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402

SCHEDULES = 10

# One succeeded run per second of plan time, the schedules taking turns.
INSERT_RUNS = f"""
    INSERT INTO {Run._meta.db_table} (
        schedule_id, plan_time, "trigger", status, attempt, max_attempts, interruptions,
        exclusive, started_at, finished_at, duration, result, error_code, error_message,
        traceback, job_name, args, kwargs, created_at, scope, tasks_backend, task_id
    )
    SELECT s.ids[1 + i %% array_length(s.ids, 1)], t.plan_time, 'schedule', 'succeeded',
        1, 1, 0, true, t.plan_time, t.plan_time + interval '1 second', interval '1 second',
        jsonb_build_object('rows', i), '', '', '', 'tests.jobs.noop', '[]', '{{}}', t.plan_time,
        '', '', ''
    FROM generate_series(0, %(runs)s - 1) AS i
    CROSS JOIN (SELECT array_agg(id ORDER BY id) AS ids FROM {Schedule._meta.db_table}) AS s
    CROSS JOIN LATERAL (SELECT %(start)s + i * interval '1 second' AS plan_time) AS t
"""

# The released lease of each run's one attempt.
INSERT_LEASES = f"""
    INSERT INTO {Lease._meta.db_table} (
        run_id, attempt, token, holder, acquired_at, heartbeat_at, expires_at, released_at,
        outcome
    )
    SELECT id, 1, gen_random_uuid(), 'bench:1', started_at, finished_at,
        started_at + interval '30 seconds', finished_at, 'succeeded'
    FROM {Run._meta.db_table}
"""

TABLES = (Lease, Run, Schedule, SchedulerProcess)


def reset() -> None:
    """Empty the app's tables at once (an ORM delete of a million rows would be the test)."""
    names = ", ".join(model._meta.db_table for model in TABLES)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def seed(runs: int) -> None:
    """``runs`` finished runs and their leases, planned a year ago and onwards."""
    reset()
    Schedule.objects.bulk_create(
        Schedule(name=f"prune-{k}", job="tests.jobs.noop", interval=timedelta(minutes=1))
        for k in range(SCHEDULES)
    )
    start = clock.now() - timedelta(days=365)
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, {"runs": runs, "start": start})
        cursor.execute(INSERT_LEASES)
        # A long-lived table has been vacuumed and analyzed; a freshly loaded one not yet.
        for model in (Run, Lease):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (Linux reports it in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_prune(runs: int, batch_size: int) -> dict:
    seed(runs)
    assert Run.objects.count() == runs and Lease.objects.count() == runs
    peak_before = peak_rss_mb()
    started = time.perf_counter()
    call_command("prune_runs", days=0, batch_size=batch_size, stdout=StringIO())
    elapsed = time.perf_counter() - started
    assert not Run.objects.exists() and not Lease.objects.exists()
    return {
        "what": f"prune_runs: {runs:,} finished runs + {runs:,} leases (batches of {batch_size})",
        "result": f"{runs / elapsed:,.0f} runs/s",
        "detail": (
            f"{elapsed:.1f} s; peak RSS {peak_rss_mb():.0f} MB "
            f"({peak_before:.0f} MB before pruning)"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 runs")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("benchmarks/prune.py seeds with PostgreSQL SQL (PERIODIC_TEST_DB=postgres).")
    call_command("migrate", verbosity=0)
    runs = 100_000 if options.quick else options.runs
    row = bench_prune(runs, options.batch_size)
    reset()
    # A row of bench.py's table, which run.sh prints just before.
    print(f"| {row['what']} | {row['result']} | {row['detail']} |")


if __name__ == "__main__":
    main()
