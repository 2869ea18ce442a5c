"""Jobs as users run them: a job that writes one row, under Django's defaults.

    bash benchmarks/run.sh            # runs this too, on the durable PostgreSQL it starts
    bash benchmarks/run.sh --quick    # smaller sizes

Every job here is ``tests.jobs.record``: one INSERT in autocommit. Every process (the
schedulers and this one) runs with Django's default ``CONN_MAX_AGE = 0``. Figures:

- a burst: N runs due at once, one ``run_scheduler --workers 8``; runs per second from its
  start until the last succeeded;
- fire lag: S schedules every second for T seconds, two ``run_scheduler --workers 8``;
  how many fires succeeded (the rest were skipped for overlap) and the start lag;
- the floor: the same INSERT in a plain loop on one connection, what the machine allows.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["PERIODIC_TEST_CONN_MAX_AGE"] = "0"  # Django's default, here and in the children

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_periodic import clock  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402
from tests.models import Execution  # noqa: E402

JOB = "tests.jobs.record"


def reset() -> None:
    for model in (Lease, Run, Schedule, SchedulerProcess, Execution):
        model.objects.all().delete()


def start_scheduler(workers: int) -> subprocess.Popen:
    env = {**os.environ, "PERIODIC_TEST_DB_NAME": connection.settings_dict["NAME"]}
    command = [sys.executable, "-m", "django", "run_scheduler", "--workers", str(workers)]
    return subprocess.Popen([*command, "-v", "0"], env=env, cwd=ROOT)


def stop(children: list[subprocess.Popen]) -> None:
    for child in children:
        child.send_signal(signal.SIGTERM)
    for child in children:
        child.wait(120)


def succeeded() -> int:
    return Run.objects.filter(status=Run.Status.SUCCEEDED).count()


def bench_burst(runs: int) -> dict:
    """``runs`` runs due at once, executed by one scheduler with 8 workers."""
    reset()
    schedule = Schedule.objects.create(
        name="burst", job=JOB, interval=timedelta(days=1), overlap="concurrent"
    )
    now = clock.now()
    Run.objects.bulk_create(
        Run.for_schedule(schedule, now - timedelta(microseconds=i), trigger=Run.Trigger.MANUAL)
        for i in range(runs)
    )
    started = time.monotonic()
    children = [start_scheduler(8)]
    deadline = started + 600
    while succeeded() < runs and time.monotonic() < deadline:
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    stop(children)
    done = succeeded()
    return {
        "what": f"burst: {runs:,} runs due at once, one process, 8 workers",
        "result": f"{done / elapsed:,.0f} runs/s",
        "detail": f"{done:,} of {runs:,} succeeded in {elapsed:.1f} s (process start included)",
    }


def bench_lag(schedules: int, seconds: int) -> dict:
    """``schedules`` schedules every second for ``seconds``, two schedulers with 8 workers."""
    reset()
    start = clock.now().replace(microsecond=0) + timedelta(seconds=5)
    Schedule.objects.bulk_create(
        Schedule(
            name=f"lag-{i}",
            job=JOB,
            interval=timedelta(seconds=1),
            start_at=start,
            end_at=start + timedelta(seconds=seconds - 1),
            next_fire_at=start,
        )
        for i in range(schedules)
    )
    children = [start_scheduler(8), start_scheduler(8)]
    fires = schedules * seconds
    deadline = time.monotonic() + seconds + 60
    while time.monotonic() < deadline:
        settled = Run.objects.filter(status__in=Run.FINAL_STATUSES).count()
        if settled >= fires:
            break
        time.sleep(0.5)
    stop(children)
    ok = Run.objects.filter(status=Run.Status.SUCCEEDED).only("plan_time", "started_at")
    lags = sorted((run.started_at - run.plan_time).total_seconds() for run in ok)
    skipped = Run.objects.filter(status=Run.Status.SKIPPED).count()
    done = len(lags)
    result = f"{done:,} of {fires:,} succeeded"
    if lags:
        p50, p99 = lags[done // 2] * 1000, lags[int(done * 0.99)] * 1000
        result += f", lag p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"
    return {
        "what": f"fire lag: {schedules:,} schedules every 1 s for {seconds} s, two processes",
        "result": result,
        "detail": f"{skipped:,} skipped (overlap or late)",
    }


def bench_floor(rows: int) -> dict:
    """The job's INSERT in a plain loop on one connection: the machine's rate."""
    reset()
    now = clock.now()
    started = time.monotonic()
    for i in range(rows):
        Execution.objects.create(schedule="floor", plan_time=now, attempt=1, pid=i)
    elapsed = time.monotonic() - started
    return {
        "what": f"floor: the job's INSERT {rows:,} times in a loop, one connection",
        "result": f"{rows / elapsed:,.0f} rows/s",
        "detail": "autocommit, no scheduler",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    call_command("migrate", verbosity=0)
    rows = [bench_floor(2_000 if quick else 10_000)]
    rows += [bench_burst(2_000 if quick else 10_000)]
    rows += [bench_lag(200, 20) if quick else bench_lag(1_000, 60)]
    reset()
    print(f"\n## A job that writes one row, CONN_MAX_AGE = 0 ({connection.vendor})\n")
    print("| measured | result | detail |\n|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['result']} | {row['detail']} |")


if __name__ == "__main__":
    main()
