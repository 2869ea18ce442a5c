"""django_periodic beside django-celery-beat, APScheduler 3 and django-periodic-tasks.

    bash benchmarks/compare/run.sh [--quick] [--only WORKLOAD,...] [--peers ours,celery-beat,...]

run.sh builds the venvs and starts PostgreSQL, PgBouncer and Redis, then runs this with
BENCH_PG_PORT, BENCH_PGBOUNCER_PORT and BENCH_REDIS_PORT set.
Workloads: planning, lag, execution, handoff, due, idle, rss, each with a no-op job; the same
with the writing job (one INSERT, CONN_MAX_AGE 0): lag-writing, steady, execution-writing,
handoff-writing, due-writing; the same with the atomic writing job (tests.jobs.atomic_record):
lag-atomic, execution-atomic, due-atomic; and floor, that job's INSERT in a loop on one
connection (run with any writing throughput workload). The lag, execution and due workloads
of the writing jobs each measure their limit beside every repetition: the same rows as plain
INSERTs with no scheduler, on as many processes and threads (limit_child.py).
lag-pgbouncer: the lag workload with our schedulers through PgBouncer in transaction mode
(not run without PgBouncer). handoff-celery: the hand-off to Celery workers through
django-tasks-fennel (not run without Redis). soak: the lag workload for 10 minutes with
KEEP_RUNS_FOR 2 min and keeping everything (one repetition each; only when asked for,
--only soak). Each figure
is the median of 3 repetitions (1 with --quick, which also uses smaller sizes). Results are
kept in benchmarks/results/compare-<full|quick>.json, one entry per workload, so that --only
reruns one workload; the table, docs/performance.md and docs/images/performance.png are
made from that file (the docs by a full run, or by any run given --docs).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import docs_page
import report
import soak
import workloads
from harness import Server, say
from peers import PEERS, Context, Ours, OursAtomic, Peer
from workloads import Plan

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = (
    "planning",
    "lag",
    "lag-pgbouncer",
    "lag-writing",
    "lag-atomic",
    "steady",
    "floor",  # before the workloads whose figures are fractions of it
    "execution",
    "execution-writing",
    "execution-atomic",
    "handoff",
    "handoff-writing",
    "handoff-celery",
    "due",
    "due-writing",
    "due-atomic",
    "idle",
    "rss",
    "soak",
)
# Run only when asked for (--only): 20 minutes for one figure.
ON_REQUEST = ("soak",)
# Their throughputs are given as fractions of the floor measured in the same run.
NEEDS_FLOOR = ("execution-writing", "handoff-writing")
OURS_ONLY = (
    "lag-pgbouncer",
    "lag-atomic",
    "execution",
    "execution-atomic",
    "handoff",
    "handoff-writing",
    "handoff-celery",
    "due",
    "due-writing",
    "due-atomic",
    "steady",
    "soak",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 repetition, smaller sizes")
    default = ",".join(w for w in WORKLOADS if w not in ON_REQUEST)
    parser.add_argument("--only", default=default, help="comma-separated workloads")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers")
    parser.add_argument("--cap", type=float, default=600, help="seconds a peer gets per run (600)")
    parser.add_argument(
        "--no-early-stop",
        action="store_true",
        help="wait out the cap even when the rate seen shows a peer cannot make it",
    )
    docs = parser.add_mutually_exclusive_group()
    docs.add_argument(
        "--docs", action="store_true", help="write the docs page (default: full runs)"
    )
    docs.add_argument("--no-docs", action="store_true", help="do not write the docs page")
    parser.add_argument(
        "--idle-schedules",
        type=int,
        help="schedules of the idle workload (the plan's: 100,000; 10,000 with --quick)",
    )
    parser.add_argument("--fresh", action="store_true", help="forget results of earlier runs")
    parser.add_argument(
        "--report", action="store_true", help="measure nothing: print (and --docs) saved results"
    )
    args = parser.parse_args()
    # A run of some workloads, peers or sizes measures too little for the docs page, which
    # it would overwrite with gaps: it writes it only when asked (--docs).
    args.narrowed = (args.only, args.peers, args.idle_schedules) != (
        default,
        ",".join(PEERS),
        None,
    )
    args.only = _choices(args.only, WORKLOADS, "workload")
    if set(args.only) & set(NEEDS_FLOOR) and "floor" not in args.only:
        args.only = [w for w in WORKLOADS if w in args.only or w == "floor"]
    args.peers = _choices(args.peers, tuple(PEERS), "peer")
    return args


def _choices(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    if unknown := [v for v in chosen if v not in allowed]:
        sys.exit(f"unknown {what}(s) {unknown}; choose from {', '.join(allowed)}")
    return [v for v in allowed if v in chosen]


def make_peers(ctx: Context, keys: list[str]) -> list[Peer]:
    peers = []
    for key in keys:
        if key == "dpt" and not ctx.dpt_python:
            say("django-periodic-tasks left out: no Python 3.13 venv (see run.sh)")
            continue
        peers.append(PEERS[key](ctx))
    return peers


def run_workload(name: str, ctx: Context, plan: Plan, peers: list[Peer]) -> list[workloads.Figure]:
    ours = next((p for p in peers if isinstance(p, Ours)), None)
    if name in OURS_ONLY and ours is None:
        say(f"[{name}] needs django_periodic (--peers ours)")
        return []
    atomic = OursAtomic(ctx)  # ours with the atomic writing job: the same database
    runners = {
        "planning": lambda: workloads.planning(ctx, plan, peers),
        "lag": lambda: workloads.fire_lag(ctx, plan, peers),
        "lag-pgbouncer": lambda: workloads.fire_lag_pgbouncer(ctx, plan, ours),
        "lag-writing": lambda: workloads.fire_lag(ctx, plan, peers, writing=True),
        "lag-atomic": lambda: workloads.fire_lag(ctx, plan, [atomic], writing=True),
        "steady": lambda: workloads.steady(ctx, plan, ours),
        "floor": lambda: workloads.floor(ctx, plan),
        "execution": lambda: workloads.execution(ctx, plan, ours),
        "execution-writing": lambda: workloads.execution_writing(ctx, plan, peers),
        "execution-atomic": lambda: workloads.execution_writing(ctx, plan, [atomic]),
        "handoff": lambda: workloads.handoff(ctx, plan, ours),
        "handoff-writing": lambda: workloads.handoff(ctx, plan, ours, writing=True),
        "handoff-celery": lambda: workloads.handoff(ctx, plan, ours, celery=True),
        "due": lambda: workloads.due_at_once(ctx, plan, ours),
        "due-writing": lambda: workloads.due_at_once(ctx, plan, ours, writing=True),
        "due-atomic": lambda: workloads.due_at_once(ctx, plan, atomic, writing=True),
        "idle": lambda: workloads.idle(ctx, plan, peers),
        "rss": lambda: workloads.memory_use(ctx, plan, peers),
        "soak": lambda: soak.soak(ctx, plan, ours),
    }
    return runners[name]()


# --- results kept between runs ----------------------------------------------------------------


def results_path(quick: bool) -> Path:
    return ROOT / "benchmarks" / "results" / f"compare-{'quick' if quick else 'full'}.json"


def load_results(path: Path, fresh: bool) -> dict:
    if fresh or not path.exists():
        return {"workloads": {}}
    return json.loads(path.read_text())


def save_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))


def all_figures(results: dict) -> report.Figures:
    return {
        (f["row"], f["peer"]): f
        for entry in results["workloads"].values()
        for f in entry["figures"]
    }


# --- the machine ------------------------------------------------------------------------------


def describe_machine(ctx: Context) -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory_kb = int(Path("/proc/meminfo").read_text().split()[1])
    durability = ctx.server.settings(["fsync", "synchronous_commit", "full_page_writes"])
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores, {memory_kb / 1024**2:.0f} GB",
        "os": platform.platform(),
        "postgresql": f"{ctx.server.version()} on 127.0.0.1, "
        + ", ".join(f"{k} {v}" for k, v in sorted(durability.items())),
        "python": f"{platform.python_version()} "
        f"(django-periodic-tasks: {_dpt_python_version(ctx)})",
        "packages": ", ".join(_versions()) + f", {_dpt_versions(ctx)}",
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _versions() -> list[str]:
    names = [
        "Django",
        "django-celery-beat",
        "celery",
        "kombu",
        "APScheduler",
        "SQLAlchemy",
        "psycopg",
    ]
    return [f"{name} {metadata.version(name)}" for name in names]


def _dpt_versions(ctx: Context) -> str:
    if not ctx.dpt_python:
        return "django-periodic-tasks not installed"
    code = (
        "from importlib.metadata import version as v; "
        "print('django-periodic-tasks', v('django-periodic-tasks') + ', django-tasks',"
        " v('django-tasks'))"
    )
    return subprocess.run(
        [ctx.dpt_python, "-c", code], capture_output=True, text=True
    ).stdout.strip()


def _dpt_python_version(ctx: Context) -> str:
    if not ctx.dpt_python:
        return "n/a"
    code = "import platform; print(platform.python_version())"
    return subprocess.run(
        [ctx.dpt_python, "-c", code], capture_output=True, text=True
    ).stdout.strip()


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    dirty = (
        " (with uncommitted changes)"
        if git("status", "--porcelain", "--", "django_periodic")
        else ""
    )
    return git("rev-parse", "--short", "HEAD") + dirty


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    early_stop = not args.no_early_stop
    plan = Plan.quick_run(args.cap, early_stop) if args.quick else Plan.full(args.cap, early_stop)
    if args.idle_schedules:
        plan = replace(plan, idle_schedules=args.idle_schedules)
    path = results_path(plan.quick)
    results = load_results(path, args.fresh)
    started = time.monotonic()
    if not args.report:
        measure_all(args, plan, results, path)
    figures = all_figures(results)
    peer_keys = [key for key in PEERS if any(peer == key for _, peer in figures)]
    say("\n" + report.markdown_table(figures, results["plan"], peer_keys) + "\n")
    say("\n".join(report.details(figures, results["plan"])))
    say(f"\nResults: {path.relative_to(ROOT)} ({(time.monotonic() - started) / 60:.0f} min)")
    if args.docs or not (plan.quick or args.no_docs or args.report or args.narrowed):
        docs_page.write(ROOT, results, figures, peer_keys)


def measure_all(args: argparse.Namespace, plan: Plan, results: dict, path: Path) -> None:
    """Prepare the peers' databases, run the chosen workloads, save after each one."""
    ctx = Context(
        server=Server(int(os.environ["BENCH_PG_PORT"])),
        root=ROOT,
        work=ROOT / "benchmarks" / "results" / "compare",
        python=sys.executable,
        dpt_python=os.environ.get("BENCH_DPT_PYTHON") or None,
        pgbouncer_port=int(os.environ.get("BENCH_PGBOUNCER_PORT") or 0) or None,
        redis_port=int(os.environ.get("BENCH_REDIS_PORT") or 0) or None,
    )
    peers = make_peers(ctx, args.peers)
    say(f"Comparison, {'quick' if plan.quick else 'full'} run: {', '.join(args.only)}")
    for peer in peers:
        peer.prepare()
    say("Databases ready: " + ", ".join(peer.database for peer in peers))
    results.update(plan=asdict(plan), machine=describe_machine(ctx))
    for name in args.only:
        figures = run_workload(name, ctx, plan, peers)
        # A rerun of some peers keeps the others' saved figures of the workload.
        kept = results["workloads"].get(name, {}).get("figures", [])
        measured = {(f.row, f.peer) for f in figures}
        others = [f for f in kept if (f["row"], f["peer"]) not in measured]
        results["workloads"][name] = {
            "ran_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "figures": others + [f.as_dict() for f in figures],
        }
        save_results(path, results)


if __name__ == "__main__":
    main()
