"""(6) History under load: 1,000 schedules every second for 10 minutes, two schedulers, once
with ``KEEP_RUNS_FOR`` of 2 minutes and once keeping everything.

With retention, the runs table must stay bounded in rows and in size on disk, the pruning
must keep pace, and the fire lag must stay within 20 % of the run that keeps everything.
One repetition of each (20 minutes in all); the rows and sizes are sampled every 10 s.
"""

import json
import time
from dataclasses import replace

from harness import Progress, percentile, say
from peers import Context, Ours
from workloads import Figure, Plan, died, measure, start_every_second

RETENTION = {"KEEP_RUNS_FOR": 120, "PRUNE_INTERVAL": 30}
SAMPLE_EVERY = 10.0
MB = 1024**2
# Lags are read from runs planned at least this long ago (started and not yet pruned).
SETTLED = 5.0


class OursWithRetention(Ours):
    """django_periodic with KEEP_RUNS_FOR of 2 minutes, pruned every 30 s."""

    key = "ours-retention"  # its own child logs; figures go to our column
    label = "django_periodic, KEEP_RUNS_FOR 2 min"

    def env(self, writing: bool = False) -> dict[str, str]:
        env = super().env(writing)
        settings = {**json.loads(env["PERIODIC_TEST_SETTINGS"]), **RETENTION}
        return {**env, "PERIODIC_TEST_SETTINGS": json.dumps(settings)}


def soak(ctx: Context, plan: Plan, ours: Ours) -> list[Figure]:
    n, seconds = plan.lag_schedules, plan.soak_seconds
    say(f"\n[soak] {n:,} schedules x every 1 s x {seconds} s, 2 schedulers, no-op job")
    once_each = replace(plan, reps=1, slow_repetition=float("inf"))
    figures = []
    for row, peer in (("soak", OursWithRetention(ctx)), ("soak:keep-all", ours)):

        def once(progress: Progress, peer: Ours = peer) -> dict[str, float]:
            return soak_once(ctx, plan, peer, progress, n, seconds)

        label = f"{peer.label}, 2 processes"
        figures.append(measure(once_each, row, ours.key, label, once, soak_summary))
    with_retention, keeping_all = figures
    if with_retention.status == keeping_all.status == "ok":
        # The retention row's goal compares its lag with this run's (report.soak_rows).
        with_retention.numbers["p99_keep_all"] = keeping_all.numbers["p99"]
    return figures


def soak_once(
    ctx: Context, plan: Plan, peer: Ours, progress: Progress, n: int, seconds: int
) -> dict[str, float]:
    children, due_at = start_every_second(ctx, plan, peer, n, seconds, processes=2)
    lags: list[float] = []
    samples: list[tuple[float, int, int]] = []  # (seconds since due, rows, bytes)
    read_to = due_at
    lost = 0
    try:
        end = due_at + seconds + 10
        while time.time() < end:
            time.sleep(SAMPLE_EVERY)
            died(children)
            samples.append((time.time() - due_at, *table_size(peer)))
            upto = min(time.time() - SETTLED, due_at + seconds)
            window, skipped = lags_between(peer, read_to, upto)
            lags += window
            lost += skipped
            read_to = upto
            progress.update(len(lags), n * seconds, f"{samples[-1][1]:,} rows")
            # The timeline, to set lag beside the prune passes (the rows fall at each).
            p99 = percentile(window, 99) * 1000 if window else float("nan")
            say(
                f"    {samples[-1][0]:5.0f} s {samples[-1][1]:9,} rows  p99 {p99:6,.0f} ms  "
                f"{skipped:5,} not succeeded"
            )
    finally:
        peer.stop(children)
    return soak_numbers(lags, lost, samples, n * seconds, peer.fired())


def table_size(peer: Ours) -> tuple[int, int]:
    """The runs table's rows, and its size on disk with its leases (indexes and TOAST in)."""
    rows, size = peer.conn.execute(
        "SELECT count(*), pg_total_relation_size('django_periodic_run') "
        "+ pg_total_relation_size('django_periodic_lease') FROM django_periodic_run"
    ).fetchone()
    return int(rows), int(size)


def lags_between(peer: Ours, start: float, end: float) -> tuple[list[float], int]:
    """The start lags of the runs planned in [start, end), and how many did not succeed."""
    rows = peer.conn.execute(
        "SELECT status, extract(epoch FROM started_at - plan_time) FROM django_periodic_run "
        "WHERE plan_time >= to_timestamp(%s) AND plan_time < to_timestamp(%s)",
        (start - 0.001, end - 0.001),
    ).fetchall()
    lags = [float(lag) for status, lag in rows if status == "succeeded"]
    return lags, len(rows) - len(lags)


def soak_numbers(
    lags: list[float], lost: int, samples: list[tuple[float, int, int]], expected: int, fired: int
) -> dict[str, float]:
    if not lags:
        raise RuntimeError("no fire kept")
    half = samples[len(samples) // 2]
    return {
        "kept": len(lags),
        "expected": expected,
        "lost": lost,
        "p50": percentile(lags, 50) * 1000,
        "p99": percentile(lags, 99) * 1000,
        "rows_max": max(rows for _, rows, _ in samples),
        "rows_end": samples[-1][1],
        "mb_half": half[2] / MB,
        "mb_end": samples[-1][2] / MB,
        "mb_max": max(size for _, _, size in samples) / MB,
        "fired": fired,
    }


def soak_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    text = (
        f"{numbers['kept']:,.0f} of {numbers['expected']:,.0f} kept; p99 {numbers['p99']:,.0f} "
        f"ms; runs at most {numbers['rows_max']:,.0f} rows; runs and leases "
        f"{numbers['mb_half']:,.0f} MB at half time, {numbers['mb_end']:,.0f} MB at the end"
    )
    deleted = numbers["fired"] - numbers["rows_end"]
    detail = f"{numbers['fired']:,.0f} runs planned, {deleted:,.0f} deleted by pruning"
    return numbers["p99"], text, detail
