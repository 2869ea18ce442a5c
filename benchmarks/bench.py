"""Measure the scheduler's hot paths against a real database and print a table.

    bash benchmarks/run.sh            # PostgreSQL started for the run, then SQLite
    bash benchmarks/run.sh --quick    # smaller sizes

Figures: planning throughput (fires turned into runs per second, queries per tick),
claim + finish throughput (runs per second through leases, one connection), the idle
cost of a scheduler (queries per tick and ticks per minute with nothing due), and the
fire lag (plan time to start) of a real run_scheduler process, and how fast a NOTIFY
wakes a sleeping one.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# The test settings poll every second; measure the shipped default instead.
os.environ.setdefault("PERIODIC_TEST_SETTINGS", '{"POLL_INTERVAL": 5}')

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from measure import QueryCounter, plan_everything_due  # noqa: E402

from django_periodic.db import clock  # noqa: E402
from django_periodic.engine.loop.scheduler import Scheduler  # noqa: E402
from django_periodic.engine.planning import planner  # noqa: E402
from django_periodic.engine.runs import claims, outcomes  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402


def reset() -> None:
    Lease.objects.all().delete()
    Run.objects.all().delete()
    Schedule.objects.all().delete()
    SchedulerProcess.objects.all().delete()


def make_due_schedules(n: int) -> None:
    now = clock.now()
    Schedule.objects.bulk_create(
        Schedule(
            name=f"bench-{i}",
            job="tests.jobs.noop",
            interval=timedelta(minutes=1),
            start_at=now - timedelta(seconds=30),
            next_fire_at=now - timedelta(seconds=30),
        )
        for i in range(n)
    )


def bench_planning(n: int) -> dict:
    reset()
    make_due_schedules(n)
    elapsed, per_batch, batch = plan_everything_due(clock.now())
    assert Run.objects.count() == n
    return {
        "what": f"plan {n} due schedules (batches of {batch})",
        "result": f"{n / elapsed:,.0f} fires/s",
        "detail": f"{elapsed:.2f} s, {per_batch:.1f} queries per batch",
    }


def bench_claim_finish(n: int, batch: int) -> dict:
    reset()
    make_due_schedules(n)
    now = clock.now()
    while planner.plan_due(now).schedules:
        pass
    process = SchedulerProcess.objects.create(host="bench", pid=0, started_at=now, heartbeat_at=now)
    started = time.perf_counter()
    done = 0
    while batch_claims := claims.claim(process, now, batch):
        for claim in batch_claims:
            outcomes.record([outcomes.succeeded(claim, None)], now)
        done += len(batch_claims)
    elapsed = time.perf_counter() - started
    assert done == n
    return {
        "what": f"claim + finish {n} runs (claims of {batch}, one connection)",
        "result": f"{n / elapsed:,.0f} runs/s",
        "detail": f"{elapsed:.2f} s",
    }


def bench_idle(schedules: int) -> dict:
    reset()
    make_due_schedules(schedules)
    Schedule.objects.update(next_fire_at=clock.now() + timedelta(hours=1))
    scheduler = Scheduler(workers=1)
    scheduler.boot()
    scheduler.tick()  # the first tick sweeps and heartbeats; measure a steady one
    counter = QueryCounter()
    with connection.execute_wrapper(counter):
        now, wake_at = scheduler.tick()
    scheduler.shutdown()
    sleep = (wake_at - now).total_seconds()
    return {
        "what": f"idle scheduler, {schedules} schedules none due",
        "result": f"{counter.count} queries per tick",
        "detail": f"sleeps {sleep:.1f} s between ticks ({60 / sleep:.0f} ticks/min)",
    }


def start_scheduler(workers: int, settings: str | None = None) -> subprocess.Popen:
    """A real run_scheduler process on the benchmark's database (settings: JSON overrides)."""
    env = {**os.environ, "PERIODIC_TEST_DB_NAME": connection.settings_dict["NAME"]}
    if settings:
        env["PERIODIC_TEST_SETTINGS"] = settings
    command = [sys.executable, "-m", "django", "run_scheduler"]
    command += ["--workers", str(workers), "-v", "0"]
    return subprocess.Popen(command, env=env, cwd=Path(__file__).resolve().parent.parent)


def bench_fire_lag(schedules: int, seconds: int) -> dict:
    """Lag from plan time to start, with a real run_scheduler process (4 workers)."""
    reset()
    start = clock.now().replace(microsecond=0) + timedelta(seconds=3)
    Schedule.objects.bulk_create(
        Schedule(
            name=f"lag-{i}",
            job="tests.jobs.noop",
            interval=timedelta(seconds=1),
            start_at=start,
            end_at=start + timedelta(seconds=seconds - 1),
            next_fire_at=start,
            overlap="concurrent",
        )
        for i in range(schedules)
    )
    child = start_scheduler(workers=4)
    expected = schedules * seconds
    deadline = time.monotonic() + seconds + 60
    while Run.objects.filter(status="succeeded").count() < expected:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    child.send_signal(signal.SIGTERM)
    child.wait(60)
    lags = sorted(
        (run.started_at - run.plan_time).total_seconds() * 1000
        for run in Run.objects.filter(status="succeeded").only("plan_time", "started_at")
    )
    done = len(lags)
    return {
        "what": f"fire lag, {schedules} schedule(s) every 1 s for {seconds} s, one process",
        "result": f"p50 {lags[done // 2]:.0f} ms, p99 {lags[int(done * 0.99)]:.0f} ms",
        "detail": f"max {lags[-1]:.0f} ms; {done} of {expected} runs succeeded",
    }


def bench_wakeup(requests: int) -> dict:
    """Lag from run_now() to start, with a real run_scheduler process polling every 600 s.

    On PostgreSQL the NOTIFY wakes it; elsewhere this measures the poll, so it is skipped.
    """
    if connection.vendor != "postgresql":
        return {"what": "wake-up after run_now()", "result": "n/a", "detail": "no NOTIFY"}
    reset()
    schedule = Schedule.objects.create(
        name="wake", job="tests.jobs.noop", interval=timedelta(days=1)
    )
    quiet = '{"POLL_INTERVAL": 600, "HEARTBEAT_INTERVAL": 300, "SWEEP_INTERVAL": 300}'
    child = start_scheduler(workers=1, settings=quiet)
    lags = []
    try:
        wait_until(lambda: _listening() == 1, 30)
        for _ in range(requests):
            run = schedule.run_now()
            done = Run.objects.filter(pk=run.pk, status="succeeded")
            wait_until(done.exists, 30)
            started = done.get().started_at
            lags.append((started - run.plan_time).total_seconds() * 1000)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(60)
    lags.sort()
    return {
        "what": f"wake-up: run_now() to start, {requests} requests, poll 600 s",
        "result": f"p50 {lags[len(lags) // 2]:.0f} ms, max {lags[-1]:.0f} ms",
        "detail": "LISTEN/NOTIFY; without it the wait is up to the poll interval",
    }


def _listening() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN django_periodic'"
        )
        return cursor.fetchone()[0]


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    call_command("migrate", verbosity=0)
    sizes = [1_000] if quick else [1_000, 10_000, 50_000]
    rows = [bench_planning(n) for n in sizes]
    rows += [bench_claim_finish(2_000 if quick else 10_000, 100)]
    rows += [bench_idle(1_000)]
    rows += [bench_fire_lag(1, 10), bench_fire_lag(50 if quick else 100, 10 if quick else 20)]
    rows += [bench_wakeup(20)]
    reset()
    engine = f"{connection.vendor} {connection.Database.__name__}"
    print(f"\n## {engine}, Django {django.get_version()}, Python {sys.version.split()[0]}\n")
    print("| measured | result | detail |\n|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['result']} | {row['detail']} |")


if __name__ == "__main__":
    main()
