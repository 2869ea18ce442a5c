"""Time planning one fire of one schedule fanned out to 10,000 scopes, on PostgreSQL.

    PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL=postgres://... \\
        python benchmarks/fanout.py [--scopes N] [--repeat N | --quick]

Registers a scope provider returning N keys, makes one schedule due and times
``planner.plan_due``: the provider's call, the two transactions and the runs' INSERT. Each
repeat starts from an empty run table. Prints one Markdown row (the columns of bench.py's
table): the median time, runs recorded per second, and the statements each fire took.
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

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from measure import QueryCounter  # noqa: E402

from django_periodic import scopes  # noqa: E402
from django_periodic.db import clock  # noqa: E402
from django_periodic.engine.planning import planner  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402

KEYS: list[str] = []


@scopes.provider(name="benchmarks.accounts")
def accounts() -> list[str]:
    """The benchmark's accounts."""
    return KEYS


def reset() -> None:
    names = ", ".join(model._meta.db_table for model in (Lease, Run, Schedule, SchedulerProcess))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def plan_one_fire(count: int) -> tuple[float, int]:
    """Seconds and statements to plan one due fire fanned out to ``count`` scopes."""
    reset()
    now = clock.now()
    schedule = Schedule.objects.create(
        name="fanout", job="tests.jobs.per_tenant", scopes="benchmarks.accounts",
        interval=timedelta(minutes=1), start_at=now - timedelta(seconds=30),
    )  # fmt: skip
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=now - timedelta(seconds=30))
    counter = QueryCounter()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        result = planner.plan_due(now)
    elapsed = time.perf_counter() - started
    assert result.fired == count == Run.objects.filter(schedule=schedule).count()
    return elapsed, counter.count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scopes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    options = parser.parse_args()
    if options.quick:
        options.repeat = 2
    if connection.vendor != "postgresql":
        sys.exit("benchmarks/fanout.py measures PostgreSQL (PERIODIC_TEST_DB=postgres).")
    call_command("migrate", verbosity=0)
    KEYS[:] = [f"account-{k}" for k in range(options.scopes)]
    plan_one_fire(options.scopes)  # warm up: connection, caches
    timings = [plan_one_fire(options.scopes) for _ in range(options.repeat)]
    reset()
    median = statistics.median(seconds for seconds, _ in timings)
    statements = max(count for _, count in timings)
    print(
        f"| plan one fire fanned out to {options.scopes:,} scopes "
        f"| {median * 1000:,.0f} ms ({options.scopes / median:,.0f} runs/s) "
        f"| median of {options.repeat}; {statements} statements |"
    )


if __name__ == "__main__":
    main()
