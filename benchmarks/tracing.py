"""What OpenTelemetry tracing (``OPENTELEMETRY``) costs per run attempt.

    PERIODIC_TEST_DB=postgres PERIODIC_TEST_POSTGRES_URL=postgres://... \\
        python benchmarks/tracing.py [--runs N] [--quick]

N due no-op runs executed as a worker executes them (claimed 100 at a time,
``executor.run_job`` each, outcomes recorded per batch), in each mode, the modes
interleaved over the repeats:

- **off**: the setting off (the default): the engine's hook is None;
- **api only**: on, with opentelemetry-api and no SDK: spans are the API's no-op ones;
- **sdk**: on, with opentelemetry-sdk's provider (given to ``start()``, not the global one)
  and a batch span processor whose exporter drops what it is given: the spans' own cost,
  no I/O.

Prints Markdown rows (the columns of bench.py's table): runs per second, and microseconds
per run beside "off".
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
from measure import plan_everything_due  # noqa: E402

from django_periodic.contrib import opentelemetry  # noqa: E402
from django_periodic.db import clock  # noqa: E402
from django_periodic.engine.loop import executor  # noqa: E402
from django_periodic.engine.loop.context import StopRequest  # noqa: E402
from django_periodic.engine.runs import claims  # noqa: E402
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess  # noqa: E402

CLAIM_BATCH = 100


def reset() -> None:
    models = (Lease, Run, Schedule, SchedulerProcess)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = ", ".join(model._meta.db_table for model in models)
            cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
        else:
            for model in models:
                model.objects.all().delete()


def due_runs(count: int) -> SchedulerProcess:
    """``count`` pending runs due now, and a process to claim them."""
    reset()
    now = clock.now()
    Schedule.objects.bulk_create(
        (
            Schedule(
                name=f"traced-{n}",
                job="tests.jobs.noop",
                interval=timedelta(hours=1),
                start_at=now - timedelta(seconds=30),
                next_fire_at=now - timedelta(seconds=30),
            )
            for n in range(count)
        ),
        batch_size=5_000,
    )
    plan_everything_due(now)
    return SchedulerProcess.objects.create(
        host="bench", pid=os.getpid(), started_at=now, heartbeat_at=now
    )


def execute_all(process: SchedulerProcess) -> tuple[int, float]:
    """Execute every due run; how many, and the seconds it took."""
    executed = 0
    started = time.perf_counter()
    while batch := claims.claim(process, None, CLAIM_BATCH):
        outcomes = [executor.run_job(claim, StopRequest()) for claim in batch]
        executor.record([outcome for outcome in outcomes if outcome is not None])
        executed += len(batch)
    return executed, time.perf_counter() - started


def sdk_provider():  # type: ignore[no-untyped-def]
    """opentelemetry-sdk's provider, with a batch processor whose exporter drops the spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return provider


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 runs, 3 repeats")
    options = parser.parse_args()
    count, repeat = (2_000, 3) if options.quick else (options.runs, options.repeat)
    call_command("migrate", verbosity=0)
    provider = sdk_provider()
    modes = {"off": None, "api only": lambda: opentelemetry.start(), "sdk": None}
    modes["sdk"] = lambda: opentelemetry.start(provider)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    execute_all(due_runs(count))  # warm-up: connections, caches
    for _ in range(repeat):  # modes interleaved, so that the machine's drift falls on each
        for mode, start in modes.items():
            process = due_runs(count)
            if start is not None:
                start()
            executed, seconds = execute_all(process)
            opentelemetry.stop()
            times[mode].append(seconds / executed)
    reset()
    off = statistics.median(times["off"])
    print(f"\n## Tracing, {connection.vendor}, {count:,} no-op runs in one thread\n")
    print("| measured | result | detail |\n|---|---|---|")
    for mode, per_run in times.items():
        median = statistics.median(per_run)
        print(
            f"| tracing {mode} | {1 / median:,.0f} runs/s | "
            f"{(median - off) * 1e6:+.0f} µs per run beside off (median of {repeat}) |"
        )


if __name__ == "__main__":
    main()
