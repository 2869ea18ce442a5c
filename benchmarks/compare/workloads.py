"""The workloads of the comparison. Each runs every selected peer (its repetitions one after
another) and returns Figures: one table cell each, the median of its repetitions.

Fires due "at once" are set up a little ahead of time, so that every scheduler is started and
idle when they come due; the lead is learned per peer and size (a peer that loads its whole
schedule at start needs longer).
"""

import json
import math
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from harness import (
    Child,
    Progress,
    cpu_seconds,
    median,
    memory,
    percentile,
    run_checked,
    say,
    wait_until,
)
from peers import Context, Ours, OursThroughPgBouncer, Peer, now_utc, ours_env
from report import limit_text, of_limit, run_ratio

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
GB = 1024**3
MB = 1024**2


@dataclass(frozen=True)
class Plan:
    """Sizes, repetitions and limits of one run (full or quick)."""

    quick: bool
    reps: int
    cap: float  # seconds a peer gets per repetition of a workload
    early_stop: bool  # give up once the rate seen shows the cap cannot be met
    planning_sizes: tuple[int, ...]
    lag_schedules: int
    lag_seconds: int
    execution_runs: int
    handoff_runs: int
    due_schedules: int
    idle_schedules: int
    idle_window: float
    idle_windows: int
    rss_sizes: tuple[int, ...]
    settle: float  # seconds after a scheduler is up before it counts as idle
    workers: int = 8  # run_scheduler --workers where the workload runs jobs
    rss_limit: int = 8 * GB
    slow_repetition: float = 120.0  # a repetition longer than this is not repeated
    floor_rows: int = 10_000  # rows the writing job's floor writes per repetition
    steady_schedules: int = 100
    steady_seconds: int = 30
    soak_seconds: int = 600  # (6) history under load, at lag_schedules fires a second

    @classmethod
    def full(cls, cap: float, early_stop: bool) -> "Plan":
        return cls(
            quick=False,
            reps=3,
            cap=cap,
            early_stop=early_stop,
            planning_sizes=(1_000, 10_000, 100_000),
            lag_schedules=1_000,
            lag_seconds=60,
            execution_runs=20_000,
            handoff_runs=5_000,
            due_schedules=10_000,
            idle_schedules=100_000,
            idle_window=120.0,
            idle_windows=3,
            rss_sizes=(10_000, 1_000_000),
            settle=20.0,
        )

    @classmethod
    def quick_run(cls, cap: float, early_stop: bool) -> "Plan":
        return cls(
            quick=True,
            reps=1,
            cap=cap,
            early_stop=early_stop,
            planning_sizes=(1_000, 10_000),
            lag_schedules=200,
            lag_seconds=20,
            execution_runs=5_000,
            handoff_runs=1_000,
            due_schedules=10_000,
            idle_schedules=10_000,
            idle_window=30.0,
            idle_windows=1,
            rss_sizes=(1_000, 100_000),
            settle=10.0,
            floor_rows=5_000,
            soak_seconds=60,
        )


@dataclass
class Figure:
    """One cell of the table."""

    row: str
    peer: str
    status: str = "ok"  # ok | dnf | unsupported | not run | error
    value: float | None = None
    text: str = ""
    detail: str = ""
    numbers: dict[str, float] = field(default_factory=dict)
    reps: int = 0
    outcomes: list[dict[str, float]] = field(default_factory=list)  # each repetition's numbers

    def as_dict(self) -> dict:
        return asdict(self)


class Unfinished(Exception):
    """A peer did not finish a repetition within the cap (or outgrew the memory limit)."""


# --- running repetitions ----------------------------------------------------------------------

Summary = Callable[[dict[str, float]], tuple[float, str, str]]


def measure(
    plan: Plan, row: str, peer: str, label: str, once: Callable[[Progress], dict], summary: Summary
) -> Figure:
    """Run ``once`` up to ``plan.reps`` times; the figure is the median of each number."""
    outcomes: list[dict[str, float]] = []
    for rep in range(plan.reps):
        progress = Progress(f"{label} (run {rep + 1}/{plan.reps})")
        started = time.monotonic()
        try:
            outcome = once(progress)
        except Unfinished as exc:
            progress.finish(str(exc))
            if not outcomes:
                return Figure(row, peer, "dnf", text=str(exc))
            break
        except Exception as exc:  # a broken peer must not end the whole comparison
            progress.finish(f"error: {exc}")
            traceback.print_exc()
            return Figure(row, peer, "error", text=f"error: {str(exc).splitlines()[0][:120]}")
        if (ratio := run_ratio(outcome)) is not None:
            outcome["of_limit"] = ratio
        outcomes.append(outcome)
        progress.finish(summary(outcome)[1])
        if time.monotonic() - started > plan.slow_repetition:
            break
    numbers = {key: median(o[key] for o in outcomes) for key in outcomes[0]}
    value, text, detail = summary(numbers)
    return Figure(row, peer, "ok", value, text, detail, numbers, len(outcomes), outcomes)


def died(children: list[Child]) -> None:
    for child in children:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited ({child.popen.returncode}):\n{child.tail()}")


def check_memory(children: list[Child], limit: int) -> None:
    for child in children:
        rss = memory(child.pid).get("VmRSS", 0)
        if rss > limit:
            child.kill()
            raise Unfinished(f"stopped at {rss / GB:.1f} GB RSS (limit {limit / GB:.0f} GB)")


def start_due(
    ctx: Context,
    plan: Plan,
    peer: Peer,
    size: int,
    setup: Callable[[datetime], None],
    launch: Callable[[], list[Child]],
) -> tuple[list[Child], float]:
    """Create schedules due a little ahead, start the peer; return once it is up and idle.

    If it was not up before the due time, start over with a longer lead (learned for the
    next repetitions)."""
    key = (peer.key, size)
    for _ in range(3):
        lead = ctx.leads.get(key, 5.0 + size * 4e-5)
        peer.reset()
        began = time.time()
        due_at = began + lead
        setup(datetime.fromtimestamp(due_at, UTC))
        peer.analyze()
        children = launch()
        try:
            up = wait_until(lambda children=children: _up(peer, children, plan), plan.cap, 0.1)
        except BaseException:
            peer.stop(children)
            raise
        if not up:
            peer.stop(children)
            raise Unfinished(f"not up within {plan.cap / 60:.0f} min with {size:,} schedules")
        if time.time() < due_at - 0.5:
            ctx.leads[key] = lead
            return children, due_at
        peer.stop(children)
        ctx.leads[key] = (time.time() - began) * 1.5 + 3
    raise Unfinished("never up before its schedules came due")


def _up(peer: Peer, children: list[Child], plan: Plan) -> bool:
    died(children)
    check_memory(children, plan.rss_limit)
    return peer.ready(children)


def wait_for_fires(
    plan: Plan,
    peer: Peer,
    kind: str,
    total: int,
    since: float,
    children: list[Child],
    progress: Progress,
) -> None:
    """Until ``total`` fires of ``kind``; Unfinished past the cap (or once the rate so far
    shows that the cap cannot be met, with ``plan.early_stop``)."""
    while (done := peer.fired(kind)) < total:
        progress.update(done, total)
        died(children)
        check_memory(children, plan.rss_limit)
        elapsed = time.time() - since
        if elapsed > plan.cap:
            raise Unfinished(f"did not finish in {plan.cap / 60:.0f} min ({done:,} of {total:,})")
        if plan.early_stop and elapsed > 60 and done and elapsed * total / done > plan.cap * 1.5:
            projected = elapsed * total / done / 60
            raise Unfinished(
                f"would not finish in {plan.cap / 60:.0f} min: {done:,} of {total:,} "
                f"after {elapsed:.0f} s, about {projected:.0f} min at that rate"
            )
        time.sleep(0.2)


# --- (1) planning -----------------------------------------------------------------------------


def planning(ctx: Context, plan: Plan, peers: list[Peer]) -> list[Figure]:
    """N schedules due at once: fires turned into runs / tasks sent per second."""
    figures: list[Figure] = []
    gave_up: dict[tuple[str, int], str] = {}
    ours = next((p for p in peers if isinstance(p, Ours)), None)
    for n in plan.planning_sizes:
        say(f"\n[planning] {n:,} schedules due at once")
        for processes in (1, 2):
            row = f"planning:{n}:{processes}"
            for peer in peers:
                if processes > 1 and not peer.multi:
                    figure = Figure(row, peer.key, "unsupported", text=peer.multi_note)
                elif (peer.key, processes) in gave_up:
                    figure = Figure(row, peer.key, "not run", text=gave_up[peer.key, processes])
                else:
                    figure = planning_figure(ctx, plan, peer, n, processes)
                if figure.status == "dnf":
                    gave_up[peer.key, processes] = f"not run: did not finish {n:,}"
                figures.append(figure)
        if ours:
            figures.append(sql_figure(plan, ours, n))
    return figures


def planning_figure(ctx: Context, plan: Plan, peer: Peer, n: int, processes: int) -> Figure:
    def once(progress: Progress) -> dict[str, float]:
        return plan_fires(ctx, plan, peer, n, processes, progress)

    label = f"{peer.label}, {processes} process{'es' * (processes > 1)}"
    return measure(plan, f"planning:{n}:{processes}", peer.key, label, once, planning_summary)


def sql_figure(plan: Plan, ours: Ours, n: int) -> Figure:
    def once(progress: Progress) -> dict[str, float]:
        return plan_in_one_statement(ours, n)

    return measure(plan, f"planning:{n}:1", "sql", "one SQL statement", once, planning_summary)


def plan_fires(
    ctx: Context, plan: Plan, peer: Peer, n: int, processes: int, progress: Progress
) -> dict[str, float]:
    children, due_at = start_due(
        ctx,
        plan,
        peer,
        n,
        lambda first: peer.add_schedules(n, first, HOUR),
        lambda: [peer.start(i, plan_only=True) for i in range(processes)],
    )
    try:
        wait_for_fires(plan, peer, peer.plan_kind, n, due_at, children, progress)
        began = peer.work_started(due_at)
        seconds = peer.last_fire(peer.plan_kind) - began
    finally:
        peer.stop(children)
    return {"n": n, "rate": n / seconds, "seconds": seconds, "wake": began - due_at}


def plan_in_one_statement(ours: Ours, n: int) -> dict[str, float]:
    ours.reset()
    ours.add_schedules(n, now_utc(-1), HOUR)
    ours.analyze()
    started = time.perf_counter()
    inserted = ours.plan_in_one_statement()
    seconds = time.perf_counter() - started
    if inserted != n:
        raise RuntimeError(f"the statement inserted {inserted} runs, not {n}")
    return {"n": n, "rate": n / seconds, "seconds": seconds, "wake": 0.0}


def planning_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    rate = numbers["rate"]
    detail = f"{numbers['n']:,.0f} in {numbers['seconds']:.2f} s"
    if numbers.get("wake", 0) > 0.5:
        detail += f", after its next poll ({numbers['wake']:.1f} s after due)"
    return rate, f"{rate:,.0f} fires/s", detail


# --- (2) fire lag -----------------------------------------------------------------------------


def fire_lag(ctx: Context, plan: Plan, peers: list[Peer], writing: bool = False) -> list[Figure]:
    """N schedules firing every second for S seconds: fires kept and lag percentiles, of the
    no-op job or (``writing``) of the writing job."""
    n, seconds = plan.lag_schedules, plan.lag_seconds
    jobs = " / ".join(dict.fromkeys(job_name(peer, writing) for peer in peers))
    say(f"\n[fire lag] {n:,} schedules x every 1 s x {seconds} s, {jobs}")
    figures = []
    for peer in peers:
        row = f"lag:{peer.job_key}" if writing else "lag"
        if peer.min_interval > SECOND:
            note = (
                f"no schedule shorter than {peer.min_interval.total_seconds() / 60:.0f} min (cron)"
            )
            figures.append(Figure(row, peer.key, "unsupported", text=note))
            continue
        if writing and peer.writing_note:
            figures.append(Figure(row, peer.key, "not run", text=peer.writing_note))
            continue
        processes = 2 if isinstance(peer, Ours) else 1
        label = f"{peer.label}, {processes} process{'es' * (processes > 1)}"

        def once(progress: Progress, peer: Peer = peer, processes: int = processes) -> dict:
            numbers = lag_once(ctx, plan, peer, processes, progress, n, seconds, writing)
            if writing and isinstance(peer, Ours):
                # Beside each repetition, its limit: the same fires as plain inserts.
                numbers |= burst_limit(ctx, plan, peer, processes, n, seconds)
            return numbers

        figures.append(measure(plan, row, peer.key, label, once, lag_summary))
    return figures


def fire_lag_pgbouncer(ctx: Context, plan: Plan, ours: Ours) -> list[Figure]:
    """The no-op lag workload, our 2 schedulers connected through PgBouncer in transaction
    mode: the row beside the direct one."""
    row = "lag:pgbouncer"
    if ctx.pgbouncer_port is None:
        say("\n[fire lag through PgBouncer] not run: PgBouncer did not start (see run.sh)")
        return [Figure(row, ours.key, "not run", text="not run: PgBouncer did not start")]
    n, seconds = plan.lag_schedules, plan.lag_seconds
    say(f"\n[fire lag] {n:,} schedules x every 1 s x {seconds} s, no-op job, through PgBouncer")
    pooled = OursThroughPgBouncer(ctx)

    def once(progress: Progress) -> dict[str, float]:
        return lag_once(ctx, plan, pooled, 2, progress, n, seconds)

    # Under our key: the figure belongs in our column, beside the direct row.
    return [measure(plan, row, ours.key, f"{pooled.label}, 2 processes", once, lag_summary)]


def steady(ctx: Context, plan: Plan, ours: Ours) -> list[Figure]:
    """2 schedulers, a few schedules of the writing job every second, no kills: every run
    is expected to succeed."""
    n, seconds = plan.steady_schedules, plan.steady_seconds
    say(f"\n[steady] 2 schedulers, {n:,} schedules x every 1 s x {seconds} s, writing job")

    def once(progress: Progress) -> dict[str, float]:
        return lag_once(ctx, plan, ours, 2, progress, n, seconds, writing=True)

    return [measure(plan, "steady", ours.key, f"{ours.label}, 2 processes", once, steady_summary)]


def job_name(peer: Peer, writing: bool) -> str:
    return peer.job_label if writing else "no-op job"


def lag_once(
    ctx: Context,
    plan: Plan,
    peer: Peer,
    processes: int,
    progress: Progress,
    n: int,
    seconds: int,
    writing: bool = False,
) -> dict[str, float]:
    children, due_at = start_every_second(ctx, plan, peer, n, seconds, processes, writing)
    try:
        end = due_at + seconds + 10  # 10 s to finish the last fires
        while time.time() < end:
            progress.update(peer.fired(peer.lag_kind), n * seconds)
            died(children)
            time.sleep(0.5)
    finally:
        peer.stop(children)
    if isinstance(peer, Ours):
        kept, lags, lost = ours_lags(peer, due_at, seconds)
    else:
        kept, lags, lost = peer_lags(peer, due_at, seconds)
    if not lags:
        raise RuntimeError("no fire kept")
    numbers = {
        "kept": kept,
        "expected": n * seconds,
        "lost": lost,
        "p50": percentile(lags, 50) * 1000,
        "p99": percentile(lags, 99) * 1000,
        "max": max(lags) * 1000,
    }
    if writing:
        numbers.update(written=peer.written(), errors=peer.job_errors())
    return numbers


def start_every_second(
    ctx: Context,
    plan: Plan,
    peer: Peer,
    n: int,
    seconds: int,
    processes: int,
    writing: bool = False,
) -> tuple[list[Child], float]:
    """``n`` schedules firing every second for ``seconds`` seconds, and the peer's processes
    started and idle before the first fire (start_due)."""
    return start_due(
        ctx,
        plan,
        peer,
        n,
        lambda first: peer.add_schedules(
            n, first, SECOND, first + (seconds - 1) * SECOND, writing=writing
        ),
        lambda: [peer.start(i, workers=plan.workers, writing=writing) for i in range(processes)],
    )


def ours_lags(ours: Ours, due_at: float, seconds: int) -> tuple[int, list[float], int]:
    rows = ours.conn.execute(
        "SELECT status, extract(epoch FROM started_at - plan_time) FROM django_periodic_run "
        "WHERE plan_time >= to_timestamp(%s) AND plan_time < to_timestamp(%s)",
        (due_at - 0.001, due_at + seconds - 0.001),
    ).fetchall()
    lags = [float(lag) for status, lag in rows if status == "succeeded"]
    return len(lags), lags, len(rows) - len(lags)


def peer_lags(peer: Peer, due_at: float, seconds: int) -> tuple[int, list[float], int]:
    def in_window(nominal: float) -> bool:
        return due_at - 0.001 <= nominal < due_at + seconds - 0.001

    lags = [at - nominal for nominal, at in peer.fires(peer.lag_kind) if in_window(nominal)]
    missed = [nominal for nominal, _ in peer.fires("missed") if in_window(nominal)]
    return len(lags), lags, len(missed)


def lag_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    text = (
        f"{numbers['kept']:,.0f} of {numbers['expected']:,.0f} kept; p50 {numbers['p50']:,.0f} ms, "
        f"p99 {numbers['p99']:,.0f} ms, max {numbers['max']:,.0f} ms"
    )
    if limit := numbers.get("limit_p99"):
        text += f"; {of_limit(numbers):.1f}x the limit's p99 {limit:,.0f} ms"
    details = [f"{numbers['lost']:,.0f} skipped or missed"] if numbers["lost"] else []
    details += written_details(numbers)
    details += limit_details(numbers)
    return numbers["p99"], text, "; ".join(details)


def steady_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    share = numbers["kept"] / numbers["expected"]
    text = (
        f"{numbers['kept']:,.0f} of {numbers['expected']:,.0f} succeeded ({share:.1%}); "
        f"start lag p99 {numbers['p99']:,.0f} ms"
    )
    details = [f"{numbers['lost']:,.0f} not succeeded"] if numbers["lost"] else []
    details += written_details(numbers)
    return share * 100, text, "; ".join(details)


def written_details(numbers: dict[str, float]) -> list[str]:
    """What the writing job left: its rows, and the runs whose job raised."""
    if "written" not in numbers:
        return []
    lines = [f"{numbers['written']:,.0f} rows written by the job"]
    if numbers.get("errors"):
        lines.append(f"{numbers['errors']:,.0f} jobs raised")
    return lines


# --- (3) execution and the 10,000-due workload (django_periodic only) -------------------------


def execution(ctx: Context, plan: Plan, ours: Ours) -> list[Figure]:
    """N pending no-op runs executed by 1 and 2 run_scheduler processes."""
    runs = plan.execution_runs
    say(f"\n[execution] {runs:,} pending no-op runs, --workers {plan.workers}")
    return [ours_execution(ctx, plan, ours, p, writing=False) for p in (1, 2)]


def execution_writing(ctx: Context, plan: Plan, peers: list[Peer]) -> list[Figure]:
    """N pending runs of the writing job: ours with 1 and 2 run_scheduler processes, the
    peers that execute jobs with their one process."""
    runs = plan.execution_runs
    jobs = " / ".join(dict.fromkeys(job_name(peer, True) for peer in peers))
    say(f"\n[execution] {runs:,} pending runs of the {jobs}, --workers {plan.workers}")
    figures = []
    for peer in peers:
        if isinstance(peer, Ours):
            figures += [ours_execution(ctx, plan, peer, p, writing=True) for p in (1, 2)]
            continue
        figures.append(peer_execution(ctx, plan, peer))
        note = peer.writing_note or peer.multi_note
        figures.append(Figure(f"execution:{peer.job_key}:2", peer.key, "not run", text=note))
    return figures


def ours_execution(ctx: Context, plan: Plan, ours: Ours, processes: int, writing: bool) -> Figure:
    def once(progress: Progress) -> dict[str, float]:
        return execution_once(ctx, plan, ours, processes, progress, writing)

    row = f"execution:{ours.job_key}:{processes}" if writing else f"execution:{processes}"
    label = f"{ours.label}, {processes} process{'es' * (processes > 1)}"
    return measure(plan, row, ours.key, label, once, execution_summary)


def execution_once(
    ctx: Context, plan: Plan, ours: Ours, processes: int, progress: Progress, writing: bool
) -> dict[str, float]:
    runs = plan.execution_runs
    ours.reset()
    # A long grace, so that no run waiting its turn is skipped: this measures execution only.
    ours.add_schedules(runs, now_utc(-1), HOUR, writing=writing, misfire_grace=HOUR)
    ours.plan_once()
    if (pending := ours.count_runs("status = 'pending'")) != runs:
        raise RuntimeError(f"{pending} runs pending, not {runs}")
    ours.analyze()
    children = [ours.start(i, workers=plan.workers, writing=writing) for i in range(processes)]
    numbers = execution_rate(plan, ours, runs, children, progress)
    if not writing:
        return numbers
    # Beside each repetition, its limit: the same rows as plain inserts, same connections.
    return with_writes(ctx, ours, numbers) | throughput_limit(ctx, plan, ours, processes, runs)


def peer_execution(ctx: Context, plan: Plan, peer: Peer) -> Figure:
    """A peer with no pending runs: N jobs of the writing job due at once, a grace of an
    hour so that none is dropped, executed by its scheduler process."""
    row = f"execution:{peer.job_key}:1"
    if peer.writing_note:
        return Figure(row, peer.key, "not run", text=peer.writing_note)

    def once(progress: Progress) -> dict[str, float]:
        return peer_execution_once(ctx, plan, peer, progress)

    label = f"{peer.label}, 1 process"
    return measure(plan, row, peer.key, label, once, execution_summary)


def peer_execution_once(
    ctx: Context, plan: Plan, peer: Peer, progress: Progress
) -> dict[str, float]:
    runs = plan.execution_runs
    children, due_at = start_due(
        ctx,
        plan,
        peer,
        runs,
        lambda first: peer.add_schedules(runs, first, HOUR, writing=True, misfire_grace=HOUR),
        lambda: [peer.start(0)],
    )
    try:
        wait_for_fires(plan, peer, peer.lag_kind, runs, due_at, children, progress)
        seconds = peer.last_fire(peer.lag_kind) - due_at
    finally:
        peer.stop(children)
    numbers = {"n": runs, "rate": runs / seconds, "seconds": seconds, "from_due": 1.0}
    return with_writes(ctx, peer, numbers)


def with_writes(ctx: Context, peer: Peer, numbers: dict[str, float]) -> dict[str, float]:
    """The writing job's rows and errors, and the floor of this run, beside the rate."""
    numbers = {**numbers, "written": peer.written(), "errors": peer.job_errors()}
    if ctx.floor:
        numbers["floor"] = ctx.floor
    return numbers


def execution_rate(
    plan: Plan, ours: Ours, runs: int, children: list[Child], progress: Progress
) -> dict[str, float]:
    """Wait for ``runs`` runs to succeed (stopping ``children`` after); their rate from the
    first start to the last finish."""
    since = time.time()
    try:
        while (done := succeeded_or_raise(ours)) < runs:
            progress.update(done, runs)
            died(children)
            if time.time() - since > plan.cap:
                minutes = plan.cap / 60
                raise Unfinished(f"did not finish in {minutes:.0f} min ({done:,} of {runs:,})")
            time.sleep(0.5)
    finally:
        ours.stop(children)
    first, last = ours.conn.execute(
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)) "
        "FROM django_periodic_run"
    ).fetchone()
    seconds = float(last - first)
    return {"n": runs, "rate": runs / seconds, "seconds": seconds}


def succeeded_or_raise(ours: Ours) -> int:
    """Runs succeeded so far; raises once one failed (a job that raised), which no wait
    would cure. One statement, as the no-op rows were always watched with."""
    succeeded, failed = ours.conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
        "count(*) FILTER (WHERE status = 'failed') FROM django_periodic_run"
    ).fetchone()
    if failed:
        raise RuntimeError(f"{failed:,} runs failed")
    return int(succeeded)


def handoff(
    ctx: Context, plan: Plan, ours: Ours, writing: bool = False, celery: bool = False
) -> list[Figure]:
    """N pending runs handed to django-tasks-db (or, ``celery``, to Celery through
    django-tasks-fennel): one run_scheduler enqueues them, 1 and 4 workers execute them."""
    runs = plan.handoff_runs
    backend = "Celery (django-tasks-fennel, Redis)" if celery else "django-tasks-db"
    say(f"\n[hand-off] {runs:,} pending runs of the {job_name(ours, writing)} through {backend}")
    if celery and ctx.redis_port is None:
        return [
            Figure(f"handoff:celery:{w}", ours.key, "not run", text="not run: no Redis")
            for w in (1, 4)
        ]
    worker = "celery worker" if celery else "db_worker"
    figures = []
    for workers in (1, 4):
        once = lambda progress, w=workers: handoff_once(  # noqa: E731
            ctx, plan, ours, w, progress, writing, celery
        )
        label = f"{ours.label} -> {backend}, {workers} {worker}{'s' * (workers > 1)}"
        kind = "celery" if celery else ("writing" if writing else "")
        row = ":".join(["handoff", *([kind] if kind else []), str(workers)])
        figures.append(measure(plan, row, ours.key, label, once, execution_summary))
    return figures


def handoff_once(
    ctx: Context,
    plan: Plan,
    ours: Ours,
    workers: int,
    progress: Progress,
    writing: bool,
    celery: bool = False,
) -> dict[str, float]:
    runs = plan.handoff_runs
    ours.reset()
    ours.add_schedules(runs, now_utc(-1), HOUR, writing=writing, misfire_grace=HOUR)
    ours.plan_once()
    if (handed := ours.hand_off_pending("celery" if celery else "database")) != runs:
        raise RuntimeError(f"{handed} runs pending, not {runs}")
    ours.analyze()
    # The scheduler enqueues while the workers execute: both are in the figure.
    children = [ours.start(0, plan_only=True, writing=writing)]
    if celery:
        children += [ours.start_celery_worker(1 + i) for i in range(workers)]
    else:
        children += [ours.start_task_worker(1 + i, writing) for i in range(workers)]
    numbers = execution_rate(plan, ours, runs, children, progress)
    return with_writes(ctx, ours, numbers) if writing else numbers


def execution_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    rate = numbers["rate"]
    text = f"{rate:,.0f} runs/s"
    if numbers.get("limit_rate"):
        text += f", {of_limit(numbers):.2f} of the limit ({limit_text(numbers)})"
    elif numbers.get("floor"):
        text += f", {rate / numbers['floor']:.2f} of the floor"
    span = (
        "from the due time to the last job done"
        if numbers.get("from_due")
        else ("first start to last finish")
    )
    details = [f"{numbers['n']:,.0f} in {numbers['seconds']:.1f} s ({span})"]
    details += written_details(numbers)
    details += limit_details(numbers)
    if numbers.get("floor"):
        details.append(f"the floor in the same run {numbers['floor']:,.0f} rows/s")
    return rate, text, "; ".join(details)


def due_at_once(ctx: Context, plan: Plan, ours: Ours, writing: bool = False) -> list[Figure]:
    """N schedules due at once, default settings, one run_scheduler --workers 8."""
    n = plan.due_schedules
    say(
        f"\n[due at once] {n:,} schedules of the {job_name(ours, writing)} due at once, "
        f"one run_scheduler --workers {plan.workers}"
    )
    once = lambda progress: due_once(ctx, plan, ours, progress, writing)  # noqa: E731
    row = f"due:{ours.job_key}" if writing else "due"
    return [measure(plan, row, ours.key, ours.label, once, due_summary)]


def due_once(
    ctx: Context, plan: Plan, ours: Ours, progress: Progress, writing: bool = False
) -> dict[str, float]:
    n = plan.due_schedules
    children, due_at = start_due(
        ctx,
        plan,
        ours,
        n,
        lambda first: ours.add_schedules(n, first, HOUR, writing=writing),
        lambda: [ours.start(0, workers=plan.workers, writing=writing)],
    )
    final = "status IN ('succeeded', 'failed', 'skipped', 'cancelled')"
    try:
        # Every run ends by its start deadline (plan time + misfire_grace, 60 s by default).
        while (done := ours.count_runs(final)) < n and time.time() < due_at + 90:
            progress.update(done, n)
            died(children)
            time.sleep(0.5)
    finally:
        ours.stop(children)
    row = ours.conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'succeeded' AND finished_at <= plan_time + "
        "interval '10 seconds'), count(*) FILTER (WHERE status = 'succeeded'), "
        "count(*) FILTER (WHERE status = 'skipped'), "
        "extract(epoch FROM max(finished_at) - min(plan_time)) FROM django_periodic_run"
    ).fetchone()
    within, succeeded, skipped, last = (float(x or 0) for x in row)
    numbers = {"n": n, "within": within, "succeeded": succeeded, "skipped": skipped, "last": last}
    if not writing:
        return numbers
    # Beside each repetition, its limit: the same rows queued at once for the same threads.
    return with_writes(ctx, ours, numbers) | due_limit(ctx, plan, ours, n)


def due_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    text = (
        f"{numbers['within']:,.0f} of {numbers['n']:,.0f} succeeded within 10 s; "
        f"{numbers['skipped']:,.0f} skipped"
    )
    if limit := numbers.get("limit_seconds"):
        done = "all" if numbers["succeeded"] == numbers["n"] else f"{numbers['succeeded']:,.0f}"
        text += (
            f"; {done} done in {numbers['last']:.1f} s, "
            f"{of_limit(numbers):.1f}x the limit's {limit:.1f} s"
        )
    details = [
        f"{numbers['succeeded']:,.0f} succeeded in all, "
        f"the last {numbers['last']:.1f} s after the fire"
    ]
    details += written_details(numbers)
    details += limit_details(numbers)
    return numbers["within"], text, "; ".join(details)


# --- the writing job's floor ------------------------------------------------------------------

FLOOR_DATABASE = "bench_floor"


def floor(ctx: Context, plan: Plan) -> list[Figure]:
    """The writing job's INSERT in a plain loop on one connection: what one connection to
    this durable server allows, the bound of the writing-job throughputs."""
    rows = plan.floor_rows
    say(f"\n[floor] the writing job's INSERT in a loop on one connection, {rows:,} rows")
    env = ours_env(ctx, FLOOR_DATABASE)
    env["PERIODIC_TEST_CONN_MAX_AGE"] = "0"  # as the writing job runs
    ctx.server.create_database(FLOOR_DATABASE)
    argv = [ctx.python, "-m", "django", "migrate", "tests", "-v", "0"]
    run_checked(argv, env, ctx.root, "floor: migrate")

    def once(progress: Progress) -> dict[str, float]:
        return floor_once(ctx, env, rows)

    figure = measure(plan, "floor", "floor", "one connection", once, floor_summary)
    ctx.floor = figure.value if figure.status == "ok" else None
    return [figure]


def floor_once(ctx: Context, env: dict[str, str], rows: int) -> dict[str, float]:
    with ctx.server.connect(FLOOR_DATABASE) as conn:
        conn.execute("TRUNCATE tests_execution")
    argv = [ctx.python, str(ctx.root / "benchmarks" / "compare" / "floor_child.py"), str(rows)]
    done = subprocess.run(
        argv, env=env, cwd=ctx.root, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"floor_child failed:\n{done.stderr[-2000:]}")
    seconds = json.loads(done.stdout.splitlines()[-1])["seconds"]
    return {"n": rows, "rate": rows / seconds, "seconds": seconds}


def floor_summary(numbers: dict[str, float]) -> tuple[float, str, str]:
    rate = numbers["rate"]
    detail = f"{numbers['n']:,.0f} rows in {numbers['seconds']:.1f} s, one connection, autocommit"
    return rate, f"{rate:,.0f} rows/s", detail


# --- the writing job's limit: the same work, no scheduler, the same processes and threads ----

LIMIT_CHILD = "limit_child.py"
# Seconds from spawning the limit's processes to their common start; longer on a retry, for
# a machine too busy to have them connected by then.
LIMIT_LEADS = (5, 15, 45)
LATE = 0.5  # a process released later than this after the common start: start over


def throughput_limit(
    ctx: Context, plan: Plan, ours: Ours, processes: int, rows: int
) -> dict[str, float]:
    """``rows`` inserts split over ``processes`` processes x ``plan.workers`` threads, each
    thread its share: the execution workload's runs with no scheduler."""
    shares = [[str(share), str(plan.workers)] for share in split(rows, processes)]
    seconds = span(run_limit(ctx, plan, ours, "throughput", shares))
    return {"limit_rate": rows / seconds, **limit_shape(plan, processes, ours)}


def due_limit(ctx: Context, plan: Plan, ours: Ours, rows: int) -> dict[str, float]:
    """``rows`` inserts queued at once, drained by one process's ``plan.workers`` threads:
    the due-at-once workload with no scheduler."""
    seconds = span(run_limit(ctx, plan, ours, "due", [[str(rows), str(plan.workers)]]))
    return {"limit_seconds": seconds, **limit_shape(plan, 1, ours)}


def burst_limit(
    ctx: Context, plan: Plan, ours: Ours, processes: int, n: int, seconds: int
) -> dict[str, float]:
    """``n`` inserts started at every whole second for ``seconds`` seconds, split over
    ``processes`` processes x ``plan.workers`` threads: the fire lag workload with no
    scheduler. The lag is each insert's start behind its second."""
    shares = [[str(share), str(seconds), str(plan.workers)] for share in split(n, processes)]
    outputs = run_limit(ctx, plan, ours, "burst", shares, seconds)
    lags = [lag for output in outputs for lag in output["lags_ms"]]
    return {
        "limit_p50": percentile(lags, 50),
        "limit_p99": percentile(lags, 99),
        **limit_shape(plan, processes, ours),
    }


def run_limit(
    ctx: Context, plan: Plan, ours: Ours, mode: str, shares: list[list[str]], busy: float = 0
) -> list[dict]:
    """One limit_child per share (its arguments after the mode), all started at the same
    whole second, in our database under our writing job's settings; their outputs.
    Started over with a longer lead if one process was not ready in time."""
    for lead in LIMIT_LEADS:
        # An empty table, as the workload's job starts with (its rows were counted).
        ours.conn.execute("TRUNCATE tests_execution")
        at = math.ceil(time.time() + lead)
        outputs = limit_processes(
            ctx, plan, ours, [[mode, *args, str(at)] for args in shares], at + busy
        )
        if max(output["late"] for output in outputs) <= LATE:
            return outputs
        say(f"  the limit's processes were not all connected {lead} s after spawning: again")
    raise RuntimeError(f"the limit's processes were never ready within {LIMIT_LEADS[-1]} s")


def limit_processes(
    ctx: Context, plan: Plan, ours: Ours, argvs: list[list[str]], busy_until: float
) -> list[dict]:
    """Run the limit's processes at once and wait for them (no longer than the cap after
    ``busy_until``); their JSON outputs."""
    script = str(ctx.root / "benchmarks" / "compare" / LIMIT_CHILD)
    env = ours.env(writing=True)
    if ours.job_key == "atomic":  # its own limit: the row and its run's UPDATE, one transaction
        env["BENCH_LIMIT_ATOMIC"] = "1"
    children = [
        subprocess.Popen(
            [ctx.python, script, *argv],
            env={**env, "BENCH_LIMIT_PROCESS": f"{index}/{len(argvs)}"},
            cwd=ctx.root,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for index, argv in enumerate(argvs)
    ]
    try:
        return [limit_output(child, busy_until + plan.cap) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def limit_output(child: subprocess.Popen, deadline: float) -> dict:
    try:
        out, err = child.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        raise Unfinished("the limit's processes did not finish within the cap") from None
    if child.returncode != 0:
        raise RuntimeError(f"limit_child failed:\n{err[-2000:]}")
    return json.loads(out.splitlines()[-1])


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` shares as even as can be."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def span(outputs: list[dict]) -> float:
    """From the first process's release to the last insert done in any of them."""
    return max(o["finished"] for o in outputs) - min(o["started"] for o in outputs)


def limit_shape(plan: Plan, processes: int, ours: Ours) -> dict[str, float]:
    """How the limit was measured: processes, threads, and whether each row came with its
    run's UPDATE in one transaction (the atomic job's own limit)."""
    atomic = float(ours.job_key == "atomic")
    return {"limit_processes": processes, "limit_threads": plan.workers, "limit_atomic": atomic}


def limit_details(numbers: dict[str, float]) -> list[str]:
    if not any(key in numbers for key in ("limit_rate", "limit_p99", "limit_seconds")):
        return []
    return [f"the limit in the same run: {limit_text(numbers)}"]


# --- (4) idle cost and (5) memory: all peers side by side, each in its own database ----------


def idle(ctx: Context, plan: Plan, peers: list[Peer]) -> list[Figure]:
    """Schedules none of which is due: transactions/s in the peer's database, CPU of its process.

    The peers run at the same time: each is measured on its own database and its own process.
    Ours prunes once a window (``PRUNE_INTERVAL`` the window's length, its first pass a
    minute after start at most), so that every window includes a retention pass. The
    server's own work in a database (autovacuum visits each one a minute) is counted with
    the peer's: an empty database beside them shows how much that is, for the details.
    """
    n = plan.idle_schedules
    windows = f"{plan.idle_windows} window(s) of {plan.idle_window:.0f} s"
    say(f"\n[idle] {n:,} schedules not due, {windows}, each with a retention pass (ours)")
    load_all(peers, n)
    ctx.server.create_database(IDLE_CONTROL)
    with ctx.server.connect(IDLE_CONTROL) as conn:
        # A table: autovacuum passes over a database never used (it has no statistics yet).
        conn.execute("CREATE TABLE control (id int)")
    running, failures = start_all(plan, peers, settings={"PRUNE_INTERVAL": plan.idle_window})
    samples: dict[str, list[tuple[float, float]]] = {key: [] for key in running}
    rss: dict[str, list[float]] = {key: [] for key in running}
    background: list[float] = []
    try:
        for window in range(plan.idle_windows):
            progress = Progress(f"window {window + 1}/{plan.idle_windows}")
            control = ctx.server.transactions(IDLE_CONTROL), time.monotonic()
            before = {
                key: idle_counters(ctx, peer, children) for key, (peer, children) in running.items()
            }
            pause(progress, plan.idle_window)
            seen = ctx.server.transactions(IDLE_CONTROL) - control[0]
            background.append(seen / (time.monotonic() - control[1]))
            say(f"    an empty database: {background[-1]:.3f} transactions/s (the server's own)")
            for key, (peer, children) in running.items():
                xacts, cpu, at = idle_counters(ctx, peer, children)
                xacts0, cpu0, at0 = before[key]
                samples[key].append(
                    ((xacts - xacts0) / (at - at0), (cpu - cpu0) / (at - at0) * 100)
                )
                rss[key].append(memory(children[0].pid)["VmRSS"] / MB)
            progress.finish("measured")
            for key, (peer, _) in running.items():
                (x, c), mb = samples[key][-1], rss[key][-1]
                say(f"    {peer.label}: {x:.3f} transactions/s, {c:.3f} % CPU, {mb:,.1f} MB")
    finally:
        for peer, children in running.values():
            peer.stop(children)
    return idle_figures(peers, samples, failures, rss, median(background))


# An empty database beside the peers': the server's own work in one, with no client.
IDLE_CONTROL = "bench_idle_control"


def pause(progress: Progress, seconds: float) -> None:
    """Sleep, showing the time go by."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        progress.update(0, note=f"{left:.0f} s left")
        time.sleep(min(left, 1.0))


def idle_counters(ctx: Context, peer: Peer, children: list[Child]) -> tuple[float, float, float]:
    cpu = sum(cpu_seconds(child.pid) for child in children)
    return ctx.server.transactions(peer.database), cpu, time.monotonic()


def idle_figures(
    peers: list[Peer],
    samples: dict[str, list[tuple[float, float]]],
    failures: dict[str, str],
    rss: dict[str, list[float]],
    background: float,
) -> list[Figure]:
    figures = []
    for peer in peers:
        if peer.key in failures:
            for row in ("idle:xacts", "idle:cpu"):
                figures.append(Figure(row, peer.key, "dnf", text=failures[peer.key]))
            continue
        xacts = [x for x, _ in samples[peer.key]]
        cpu = [c for _, c in samples[peer.key]]
        reps = len(xacts)
        several = reps > 1
        figures.append(
            Figure(
                "idle:xacts",
                peer.key,
                "ok",
                median(xacts),
                f"{median(xacts):.3f} /s",
                (f"highest of {reps} windows {max(xacts):.3f} /s; " if several else "")
                + f"an empty database beside it {background:.3f} /s (the server's own work)",
                {"median": median(xacts), "background": background},
                reps,
            )
        )
        first, last = rss[peer.key][0], rss[peer.key][-1]
        memory_text = f"RSS {first:,.1f} MB after the first window, {last:,.1f} MB after the last"
        figures.append(
            Figure(
                "idle:cpu",
                peer.key,
                "ok",
                median(cpu),
                f"{median(cpu):.3f} %",
                (f"highest of {reps} windows {max(cpu):.3f} %; " if several else "") + memory_text,
                {"median": median(cpu), "rss_first_mb": first, "rss_last_mb": last},
                reps,
            )
        )
    return figures


def memory_use(ctx: Context, plan: Plan, peers: list[Peer]) -> list[Figure]:
    """RSS of each scheduler process, settled, with N schedules (none due), side by side."""
    results: dict[tuple[str, int], list[float]] = {}
    failures: dict[tuple[str, int], str] = {}
    for n in plan.rss_sizes:
        say(f"\n[memory] {n:,} schedules not due")
        load_all(peers, n)
        for rep in range(plan.reps):
            say(f"  start {rep + 1}/{plan.reps}")
            began = time.monotonic()
            live = [p for p in peers if (p.key, n) not in failures]
            running, failed = start_all(plan, live)
            for key, message in failed.items():
                failures[key, n] = message
            for key, (peer, children) in running.items():
                rss = memory(children[0].pid)["VmRSS"]
                results.setdefault((key, n), []).append(rss)
                say(f"    {peer.label}: {rss / MB:,.1f} MB")
                peer.stop(children)
            if time.monotonic() - began > plan.slow_repetition:
                break
    return memory_figures(plan, peers, results, failures)


def memory_figures(
    plan: Plan,
    peers: list[Peer],
    results: dict[tuple[str, int], list[float]],
    failures: dict[tuple[str, int], str],
) -> list[Figure]:
    figures = []
    low, high = plan.rss_sizes[0], plan.rss_sizes[-1]
    for peer in peers:
        for n in plan.rss_sizes:
            if (peer.key, n) in failures:
                figures.append(Figure(f"rss:{n}", peer.key, "dnf", text=failures[peer.key, n]))
            else:
                rss = median(results[peer.key, n])
                reps = len(results[peer.key, n])
                figures.append(
                    Figure(
                        f"rss:{n}",
                        peer.key,
                        "ok",
                        rss / MB,
                        f"{rss / MB:,.1f} MB",
                        "",
                        {"rss": rss},
                        reps,
                    )
                )
        if (peer.key, low) in results and (peer.key, high) in results:
            growth = (median(results[peer.key, high]) - median(results[peer.key, low])) / MB
            figures.append(Figure("rss:growth", peer.key, "ok", growth, f"{growth:+,.1f} MB"))
        else:
            figures.append(Figure("rss:growth", peer.key, "not run", text="n/a"))
    return figures


def load_all(peers: list[Peer], n: int) -> None:
    """Every peer gets N schedules whose first fire is a day away."""
    for peer in peers:
        progress = Progress(f"loading {n:,} schedules for {peer.label}")
        peer.reset()
        peer.add_schedules(n, now_utc(DAY.total_seconds()), DAY)
        peer.analyze()
        progress.finish("loaded")


def start_all(
    plan: Plan, peers: list[Peer], **options: object
) -> tuple[dict[str, tuple[Peer, list[Child]]], dict[str, str]]:
    """Start one scheduler per peer (with ``options``, those a peer's ``start`` takes); return
    those up and settled, and why the others are not."""
    pending = {peer.key: (peer, [peer.start(0, **options)]) for peer in peers}
    running: dict[str, tuple[Peer, list[Child]]] = {}
    failures: dict[str, str] = {}
    up_at: dict[str, float] = {}
    started = time.monotonic()
    progress = Progress("starting " + ", ".join(peer.label for peer in peers))
    while pending:
        for key, (peer, children) in list(pending.items()):
            try:
                if key not in up_at and _up(peer, children, plan):
                    up_at[key] = time.monotonic()
                elif time.monotonic() - started > plan.cap:
                    raise Unfinished(f"not settled within {plan.cap / 60:.0f} min")
            except (Unfinished, RuntimeError) as exc:
                failures[key] = str(exc).splitlines()[0]
                peer.stop(children)
                del pending[key]
                continue
            if key in up_at and time.monotonic() - up_at[key] >= plan.settle:
                running[key] = pending.pop(key)
        progress.update(len(running), len(peers))
        time.sleep(0.5)
    progress.finish(f"{len(running)} up" + (f", {len(failures)} failed" if failures else ""))
    return running, failures
