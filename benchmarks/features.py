"""Planning and idle cost with 100,000 schedules, plain and with features in use, on PostgreSQL.

    PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL=postgres://... \\
        python benchmarks/features.py [--schedules N] [--quick]

Each mix is the same N hourly schedules, interval schedules; in "features", every tenth
has a jitter (a 10-minute stagger) and another tenth a calendar (closed on weekends and on
two dates); in "changes", every tenth is an RRULE (``FREQ=HOURLY``) and another tenth has
an override (its due fire skipped by an operator), so that the cost of the features shows
beside the plain figures:

- **plan**: ``planner.plan_due`` turning N due fires into runs, in batches of
  ``PLAN_BATCH_SIZE``; fires per second and queries per batch.
- **idle**: a scheduler's tick when nothing is due: its queries, its median time over
  repeated ticks, and how long it then sleeps.

Then one fire of one schedule fanned out to 10,000 scopes with a 10-minute jitter: how many
runs each minute of the ten releases (evenly: about 1,000). Prints Markdown rows (the
columns of bench.py's table).
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from measure import QueryCounter, plan_everything_due  # noqa: E402

from django_periodic import scopes  # noqa: E402
from django_periodic.db import clock  # noqa: E402
from django_periodic.engine.loop.scheduler import Scheduler  # noqa: E402
from django_periodic.engine.planning import planner  # noqa: E402
from django_periodic.models import (  # noqa: E402
    Calendar,
    FireOverride,
    Lease,
    Run,
    Schedule,
    SchedulerProcess,
)

EVERY = timedelta(hours=1)
JITTER = timedelta(minutes=10)
TENANTS = [f"tenant-{n}" for n in range(10_000)]


@scopes.provider(name="benchmarks.tenants")
def tenants() -> list[str]:
    """The benchmark's tenants."""
    return TENANTS


def reset() -> None:
    models = (Lease, Run, FireOverride, Schedule, SchedulerProcess, Calendar)
    names = ", ".join(model._meta.db_table for model in models)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


def plain(n: int) -> dict:
    return {}


def features(n: int) -> dict:
    """Every tenth schedule staggered, another tenth under a calendar."""
    if n % 10 == 0:
        return {"jitter": JITTER}
    return {"calendars": True} if n % 10 == 1 else {}


def changes(n: int) -> dict:
    """Every tenth schedule an RRULE, another tenth with its due fire overridden."""
    if n % 10 == 2:
        return {"rrule": "FREQ=HOURLY", "interval": None, "timezone": "UTC"}
    return {"override": True} if n % 10 == 3 else {}


MIXES: dict[str, Callable[[int], dict]] = {
    "plain": plain,
    "features": features,
    "changes": changes,
}
# The fields of a mix that are rows of their own, not Schedule fields.
NOT_FIELDS = ("calendars", "override")


def make_schedules(count: int, mix: Callable[[int], dict], due: bool) -> None:
    reset()
    now = clock.now().replace(microsecond=0)  # an RRULE's times are whole seconds
    start_at = now - timedelta(seconds=30)
    cursor = start_at if due else start_at + EVERY
    fields = [mix(n) for n in range(count)]
    created = Schedule.objects.bulk_create(
        (
            Schedule(
                name=f"bench-{n}",
                job="tests.jobs.noop",
                **{
                    "interval": EVERY,
                    "start_at": start_at,
                    "next_fire_at": cursor,
                    **{k: v for k, v in fields[n].items() if k not in NOT_FIELDS},
                },
            )
            for n in range(count)
        ),
        batch_size=5_000,
    )
    # Open today, whatever day it is, so that every due fire runs as in the plain mix.
    closed = [day for day in range(7) if day != now.weekday()][:2]
    calendar = Calendar.objects.create(
        name="bench", timezone="UTC", closed_weekdays=closed, closed_dates=["2030-12-24"]
    )
    Through = Schedule.calendars.through
    Through.objects.bulk_create(
        (
            Through(schedule_id=schedule.pk, calendar_id=calendar.pk)
            for schedule, chosen in zip(created, fields, strict=True)
            if chosen.get("calendars")
        ),
        batch_size=5_000,
    )
    FireOverride.objects.bulk_create(
        (
            FireOverride(schedule_id=schedule.pk, plan_time=cursor, action="skip", reason="bench")
            for schedule, chosen in zip(created, fields, strict=True)
            if chosen.get("override")
        ),
        batch_size=5_000,
    )
    with connection.cursor() as cursor_:
        cursor_.execute("ANALYZE")


def plan(count: int, mix: str) -> dict:
    make_schedules(count, MIXES[mix], due=True)
    elapsed, per_batch, _batch = plan_everything_due(clock.now())
    assert Run.objects.count() == count
    return {
        "what": f"plan {count:,} due schedules, {mix}",
        "result": f"{count / elapsed:,.0f} fires/s",
        "detail": f"{elapsed:.2f} s, {per_batch:.1f} queries per batch",
    }


def idle(count: int, mix: str, ticks: int) -> dict:
    make_schedules(count, MIXES[mix], due=False)
    scheduler = Scheduler(workers=1)
    scheduler.boot()
    scheduler.tick()  # the first tick sweeps and heartbeats; measure steady ones
    counter = QueryCounter()
    with connection.execute_wrapper(counter):
        now, wake_at = scheduler.tick()
    took = []
    for _ in range(ticks):
        started = time.perf_counter()
        scheduler.tick()
        took.append(time.perf_counter() - started)
    scheduler.shutdown()
    return {
        "what": f"idle tick, {count:,} schedules none due, {mix}",
        "result": f"{counter.count} queries per tick",
        "detail": f"median {statistics.median(took) * 1000:.2f} ms over {ticks} ticks, then"
        f" sleeps {(wake_at - now).total_seconds():.1f} s",
    }


def staggered_fanout() -> dict:
    reset()
    now = clock.now()
    schedule = Schedule.objects.create(
        name="fanout", job="tests.jobs.per_tenant", scopes="benchmarks.tenants",
        interval=EVERY, start_at=now - timedelta(seconds=30), jitter=JITTER,
    )  # fmt: skip
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=now - timedelta(seconds=30))
    planner.plan_due(now)
    runs = Run.objects.filter(schedule=schedule).values_list("plan_time", "release_at")
    minute = timedelta(minutes=1)
    per_minute = Counter((release - plan_time) // minute for plan_time, release in runs)
    counts = [per_minute[n] for n in range(10)]
    return {
        "what": f"one fire over {len(TENANTS):,} scopes, jitter {JITTER}",
        "result": f"{min(counts):,} to {max(counts):,} runs released per minute",
        "detail": f"{sum(counts):,} runs over 10 minutes; every minute: {counts}",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10,000 schedules, fewer ticks")
    options = parser.parse_args()
    count = 10_000 if options.quick else options.schedules
    ticks = 20 if options.quick else 100
    call_command("migrate", verbosity=0)
    rows = []
    for mix in MIXES:
        rows += [plan(count, mix), idle(count, mix, ticks)]
    rows.append(staggered_fanout())
    reset()
    print(f"\n## Features in use, Django {django.get_version()}, Python {sys.version.split()[0]}\n")
    print("| measured | result | detail |\n|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['result']} | {row['detail']} |")


if __name__ == "__main__":
    main()
