"""The comparison's output: the Markdown table (with each goal beside our figure), the PNG
chart and docs/performance.md, all made from the saved results."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PEER_COLUMNS = {
    "ours": "django_periodic",
    "celery-beat": "django-celery-beat",
    "apscheduler": "APScheduler 3",
    "dpt": "django-periodic-tasks",
}
COLORS = {
    "ours": "#1f77b4",
    "celery-beat": "#2ca02c",
    "apscheduler": "#ff7f0e",
    "dpt": "#9467bd",
    "sql": "#7f7f7f",
}
# The writing jobs: (the key in their rows, their name in the rows' labels).
WRITING_JOBS = (("writing", "writing job"), ("atomic", "atomic writing job"))
# Whose limit each is measured against: the atomic job's own is its row and its run's
# UPDATE in one transaction per run (limit_child.py).
LIMIT_NAMES = {"writing": "the limit", "atomic": "its own limit"}
# Their lag goals: (the goal, the most times the limit's p99 that meets it).
LAG_GOALS = {
    "writing": ("all succeeded; p99 <= 2x the limit's", 2.0),
    "atomic": ("all succeeded; start lag p99 <= 1.5x its own limit's", 1.5),
}
# The writing job's figures beside its floor (workloads.floor), unless they have a limit.
FLOOR_ROWS = (
    "execution:writing:1",
    "execution:writing:2",
    "handoff:writing:1",
    "handoff:writing:4",
)
CRASH_NOTE = (
    "The crash workload (schedulers SIGKILLed at random while they run) and its goal are "
    "reported by the crash suite (`tests/crash.py`), not here."
)

Figures = dict[tuple[str, str], dict]  # (row, peer) -> a workloads.Figure as a dict


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    goal: str = ""
    met: Callable[[dict], bool] | None = None


def rows_for(plan: dict) -> list[Row]:
    """The table's rows, in order, for the sizes of this run."""
    rows = []
    for n in plan["planning_sizes"]:
        for processes in (1, 2):
            goal, met = "", None
            if n == 100_000:
                goal, met = ">= 20,000 fires/s", _at_least(20_000)
            label = f"(1) planning: {n:,} due at once, {processes} scheduler{'s' * (processes > 1)}"
            rows.append(Row(f"planning:{n}:{processes}", label, goal, met))
    rows += lag_rows(plan)
    rows += soak_rows(plan)
    runs = plan["execution_runs"]
    rows.append(
        Row(
            "execution:1",
            f"(3) execution: {runs:,} pending no-op runs, 1 process",
            ">= 3,600 runs/s",
            _at_least(3_600),
        )
    )
    rows.append(
        Row(
            "execution:2",
            f"(3) execution: {runs:,} pending no-op runs, 2 processes",
            ">= 5,400 runs/s",
            _at_least(5_400),
        )
    )
    rows += writing_execution_rows(plan)
    runs = plan.get("handoff_runs", 0)
    handoffs = (
        ("no-op", "handoff", "django-tasks-db", "db_worker"),
        ("writing-job", "handoff:writing", "django-tasks-db", "db_worker"),
        ("no-op", "handoff:celery", "Celery (django-tasks-fennel, Redis)", "celery worker"),
    )
    for job, key, via, worker in handoffs:
        for workers in (1, 4):
            plural = "s" * (workers > 1)
            rows.append(
                Row(
                    f"{key}:{workers}",
                    f"(3) hand-off: {runs:,} {job} runs via {via}, {workers} {worker}{plural}",
                )
            )
    rows += due_rows(plan)
    n = plan["idle_schedules"]
    rows.append(
        Row(
            "idle:xacts",
            f"(4) idle, {n:,} schedules not due, a retention pass a window: database transactions",
            "<= 0.05 /s",
            _at_most(0.05),
        )
    )
    rows.append(
        Row(
            "idle:cpu",
            f"(4) idle, {n:,} schedules not due, a retention pass a window: "
            "CPU of the scheduler process",
            "<= 0.05 %",
            _at_most(0.05),
        )
    )
    for n in plan["rss_sizes"]:
        rows.append(Row(f"rss:{n}", f"(5) RSS of the scheduler process, {n:,} schedules"))
    low, high = plan["rss_sizes"][0], plan["rss_sizes"][-1]
    rows.append(
        Row(
            "rss:growth",
            f"(5) RSS growth from {low:,} to {high:,} schedules",
            "within 20 MB",
            lambda f: abs(f["value"]) <= 20,
        )
    )
    return rows


def lag_rows(plan: dict) -> list[Row]:
    """Fire lag with the no-op job (p99 in every run, not only the median's), the same
    through PgBouncer, with the writing job, and the small no-kill workload of the writing
    job."""
    n, s, reps = plan["lag_schedules"], plan["lag_seconds"], plan["reps"]
    each = f" in each of the {reps} runs" if reps > 1 else ""
    sn, ss = plan.get("steady_schedules", 100), plan.get("steady_seconds", 30)
    goal = f"all {n * s:,} succeeded, p99 <= 50 ms{each}"

    def met(f: dict) -> bool:
        return all(o["kept"] == o["expected"] and o["p99"] <= 50 for o in _outcomes(f))

    return [
        Row(
            "lag",
            f"(2) fire lag: {n:,} schedules x every 1 s x {s} s (ours: 2 schedulers)",
            goal,
            met,
        ),
        # The same goal: a deployment through PgBouncer should not pay for it in lag.
        Row(
            "lag:pgbouncer",
            f"(2) fire lag through PgBouncer (transaction mode): {n:,} schedules x every 1 s x "
            f"{s} s (ours: 2 schedulers)",
            goal,
            met,
        ),
        *(
            Row(
                f"lag:{key}",
                f"(2) fire lag, {job}: {n:,} schedules x every 1 s x {s} s (ours: 2 schedulers)",
                LAG_GOALS[key][0],
                _lag_within_limit(LAG_GOALS[key][1]),
            )
            for key, job in WRITING_JOBS
        ),
        Row(
            "steady",
            f"(2) 2 schedulers, {sn:,} schedules of the writing job x every 1 s x {ss} s, no kills",
            "100 % succeeded",
            lambda f: f["numbers"]["kept"] == f["numbers"]["expected"],
        ),
    ]


def soak_rows(plan: dict) -> list[Row]:
    """History under load: bounded with retention (no growth past 10 % in the second half),
    and its lag p99 within 20 % of the run that keeps everything."""
    n, s = plan["lag_schedules"], plan.get("soak_seconds", 600)
    what = f"{n:,} schedules x every 1 s x {s // 60} min, 2 schedulers"

    def met(f: dict) -> bool:
        numbers = f["numbers"]
        bounded = numbers["mb_end"] <= 1.1 * numbers["mb_half"]
        keep_all = numbers.get("p99_keep_all")  # none when that run did not finish
        return bounded and keep_all is not None and numbers["p99"] <= 1.2 * keep_all

    return [
        Row(
            "soak",
            f"(6) history: {what}, KEEP_RUNS_FOR 2 min (pruned every 30 s)",
            "runs table bounded in rows and MB; p99 within 20 % of the next row",
            met,
        ),
        Row("soak:keep-all", f"(6) history: {what}, everything kept"),
    ]


def writing_execution_rows(plan: dict) -> list[Row]:
    runs = plan["execution_runs"]
    return [
        Row(
            f"execution:{key}:{processes}",
            f"(3) execution: {runs:,} pending runs of the {job}, "
            f"{processes} process{'es' * (processes > 1)}",
            f">= 0.7 of {LIMIT_NAMES[key]}'s rate with the same connections",
            lambda f: _limit_ratio(f) >= 0.7,
        )
        for key, job in WRITING_JOBS
        for processes in (1, 2)
    ]


def due_rows(plan: dict) -> list[Row]:
    """N due at once: the no-op job within 10 s; the writing jobs all done within 1.5x the
    time of their limit (the same rows queued for the same threads, no scheduler)."""
    n, workers = plan["due_schedules"], plan["workers"]
    rows = [
        Row(
            "due",
            f"{n:,} due at once, default settings, one run_scheduler --workers {workers}",
            f"all {n:,} succeeded within 10 s of the fire",
            lambda f: f["numbers"]["within"] >= f["numbers"]["n"],
        )
    ]

    def met(f: dict) -> bool:
        all_done = f["numbers"]["succeeded"] >= f["numbers"]["n"]
        return all_done and _limit_ratio(f) <= 1.5

    for key, job in WRITING_JOBS:
        label = f"{n:,} due at once, {job}, default settings, one run_scheduler --workers {workers}"
        goal = f"all done within 1.5x {LIMIT_NAMES[key]}'s time"
        rows.append(Row(f"due:{key}", label, goal, met))
    return rows


def _lag_within_limit(times: float) -> Callable[[dict], bool]:
    def met(f: dict) -> bool:
        all_kept = f["numbers"]["kept"] == f["numbers"]["expected"]
        return all_kept and _limit_ratio(f) <= times

    return met


# Each figure beside its limit: our number, the limit's number for the same work.
LIMIT_PAIRS = (("rate", "limit_rate"), ("last", "limit_seconds"), ("p99", "limit_p99"))


def run_ratio(numbers: dict) -> float | None:
    """One repetition's number over the limit measured in the same repetition (None
    without a limit)."""
    for key, limit_key in LIMIT_PAIRS:
        if numbers.get(limit_key) and key in numbers:
            return numbers[key] / numbers[limit_key]
    return None


def of_limit(numbers: dict) -> float | None:
    """A figure's ratio to its limit: the median of each repetition's own ratio
    (``of_limit``, kept by workloads.measure) where there is one, for a run's number and its
    limit share the machine's state of that moment; else the ratio of the medians."""
    return numbers.get("of_limit", run_ratio(numbers))


def _limit_ratio(figure: dict) -> float:
    """The figure's ratio to its limit (NaN without a limit: no goal is met by it)."""
    ratio = of_limit(figure["numbers"])
    return float("nan") if ratio is None else ratio


def _outcomes(figure: dict) -> list[dict]:
    """Each repetition's numbers (results saved before they were kept: the median only)."""
    return figure.get("outcomes") or [figure["numbers"]]


def _at_least(bound: float) -> Callable[[dict], bool]:
    return lambda f: f["value"] >= bound


def _at_most(bound: float) -> Callable[[dict], bool]:
    return lambda f: f["value"] <= bound


# --- the table --------------------------------------------------------------------------------


def cell(figure: dict | None, plan: dict) -> str:
    if figure is None:
        return "—"
    if figure["status"] == "unsupported":
        return f"not supported: {figure['text']}"
    text = figure["text"]
    if (
        figure["status"] == "ok"
        and 0 < figure["reps"] < plan["reps"]
        and figure["row"].split(":")[0] not in ("idle",)
    ):
        text += f" ({figure['reps']} of {plan['reps']} runs: it took minutes)"
    outcomes = figure.get("outcomes") or []
    if len(outcomes) > 1 and all("p99" in o for o in outcomes):
        text += "; p99 of each run: " + ", ".join(f"{o['p99']:,.0f}" for o in outcomes) + " ms"
    return text


def goal_status(row: Row, figure: dict | None) -> str:
    if not row.goal or figure is None:
        return ""
    if figure["status"] != "ok" or row.met is None:
        return "no"
    return "yes" if row.met(figure) else "**no**"


def ours_cell(row: Row, figures: Figures, plan: dict) -> str:
    text = cell(figures.get((row.key, "ours")), plan)
    ours, sql = figures.get((row.key, "ours")), figures.get((row.key, "sql"))
    if ours and sql and ours["status"] == "ok" and sql["status"] == "ok":
        text += f" ({ours['value'] / sql['value']:.0%} of one SQL statement)"
    return text


def limit_text(numbers: dict) -> str:
    """The limit measured beside a writing-job figure (workloads.run_limit): the same rows
    as plain inserts with no scheduler, the same processes and threads."""
    processes, threads = int(numbers["limit_processes"]), int(numbers["limit_threads"])
    how = f"{threads} connections"
    if processes > 1:
        how = f"{processes} processes x {how}"
    if numbers.get("limit_atomic"):
        how += ", each row and its run's UPDATE in one transaction"
    if "limit_rate" in numbers:
        return f"{numbers['limit_rate']:,.0f} rows/s with {how}, no scheduler"
    if "limit_p99" in numbers:
        return (
            f"start lag p50 {numbers['limit_p50']:,.0f} ms, p99 {numbers['limit_p99']:,.0f} ms "
            f"with {how}, no scheduler"
        )
    return f"all done in {numbers['limit_seconds']:.1f} s with {how}, no scheduler"


def limit_cell(row: Row, figures: Figures, plan: dict) -> str:
    """The machine's limit for the row's work: one SQL statement for planning; for the
    writing jobs the same rows with no scheduler, measured beside our figure, or else the
    job's INSERT in a loop on one connection (the floor)."""
    if sql := figures.get((row.key, "sql")):
        return cell(sql, plan)
    ours = figures.get((row.key, "ours"))
    if ours and ours["status"] == "ok" and "limit_processes" in ours["numbers"]:
        return limit_text(ours["numbers"])
    if row.key in FLOOR_ROWS and (floor := figures.get(("floor", "floor"))):
        return cell(floor, plan) + " (the floor: the job's INSERT in a loop, one connection)"
    return ""


def markdown_table(figures: Figures, plan: dict, peers: list[str]) -> str:
    columns = [key for key in PEER_COLUMNS if key in peers and key != "ours"]
    head = ["workload", "goal (ours)", "django_periodic", "goal met"]
    head += [PEER_COLUMNS[key] for key in columns]
    head.append("machine limit (one SQL statement; the writing job with no scheduler)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows_for(plan):
        ours = figures.get((row.key, "ours"))
        cells = [row.label, row.goal, ours_cell(row, figures, plan), goal_status(row, ours)]
        cells += [cell(figures.get((row.key, key)), plan) for key in columns]
        cells.append(limit_cell(row, figures, plan))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(figures: Figures, plan: dict) -> list[str]:
    """One line per figure that has more to say than its cell."""
    labels = {row.key: row.label for row in rows_for(plan)}
    lines = []
    for row in rows_for(plan):
        for peer in [*PEER_COLUMNS, "sql"]:
            figure = figures.get((row.key, peer))
            if figure and figure.get("detail"):
                name = PEER_COLUMNS.get(peer, "one SQL statement")
                lines.append(f"- {labels[row.key]}, {name}: {figure['detail']}")
    if (floor := figures.get(("floor", "floor"))) and floor["status"] == "ok":
        lines.append(
            f"- The writing job's floor (`Execution.objects.create` in a loop): {floor['text']}, "
            f"{floor['detail']}"
        )
    return lines


# --- the chart --------------------------------------------------------------------------------


def chart(figures: Figures, plan: dict, peers: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    _planning_panel(axes[0][0], figures, plan, peers)
    _lag_panel(axes[0][1], figures, peers)
    _execution_panel(axes[0][2], figures, plan)
    _idle_panel(axes[1][0], figures, peers, "idle:cpu", "idle CPU, % of a core", 0.05)
    _idle_panel(axes[1][1], figures, peers, "idle:xacts", "idle database transactions /s", 0.05)
    _memory_panel(axes[1][2], figures, plan, peers)
    fig.suptitle("django_periodic beside its peers (one machine, same PostgreSQL, same run)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _ok(figures: Figures, row: str, peer: str) -> dict | None:
    figure = figures.get((row, peer))
    return figure if figure and figure["status"] == "ok" and figure["value"] is not None else None


def _planning_panel(ax, figures: Figures, plan: dict, peers: list[str]) -> None:
    sizes = plan["planning_sizes"]
    series = [(peer, 1, "-") for peer in peers] + [("ours", 2, "--"), ("sql", 1, ":")]
    for peer, processes, style in series:
        points = [
            (n, f["value"]) for n in sizes if (f := _ok(figures, f"planning:{n}:{processes}", peer))
        ]
        if points:
            label = PEER_COLUMNS.get(peer, "one SQL statement") + (
                " (2 schedulers)" if processes > 1 else ""
            )
            ax.plot(*zip(*points, strict=True), style, marker="o", color=COLORS[peer], label=label)
    ax.axhline(20_000, color="red", lw=0.8, ls="--", label="goal at 100,000: 20,000/s")
    ax.set(xscale="log", yscale="log", xlabel="schedules due at once", ylabel="fires per second")
    ax.set_title("(1) planning throughput")
    ax.legend(fontsize=7)


def _lag_panel(ax, figures: Figures, peers: list[str]) -> None:
    names, p50, p99 = [], [], []
    for peer in peers:
        if f := _ok(figures, "lag", peer):
            names.append(PEER_COLUMNS[peer])
            p50.append(max(f["numbers"]["p50"], 0.1))
            p99.append(max(f["numbers"]["p99"], 0.1))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50", color="#aec7e8")
    ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99", color="#1f77b4")
    ax.axhline(50, color="red", lw=0.8, ls="--", label="goal: p99 50 ms")
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set(yscale="log", ylabel="ms after the nominal time")
    ax.set_title("(2) fire lag, every schedule every second")
    ax.legend(fontsize=7)


def _execution_panel(ax, figures: Figures, plan: dict) -> None:
    bars = [(f"execution:{p}", f"no-op,\n{p} proc.", goal) for p, goal in ((1, 3_600), (2, 5_400))]
    for key, _ in WRITING_JOBS:
        for p in (1, 2):
            # Its goal: 0.7 of the limit measured beside it.
            limit = (_ok(figures, f"execution:{key}:{p}", "ours") or {}).get("numbers", {})
            goal = 0.7 * limit.get("limit_rate", 0)
            bars.append((f"execution:{key}:{p}", f"{key},\n{p} proc.", round(goal)))
    shown = [(f, name, goal) for key, name, goal in bars if (f := _ok(figures, key, "ours"))]
    names = [f"{name}\n(goal {goal:,})" for _, name, goal in shown]
    ax.bar(names, [f["value"] for f, _, _ in shown], color=COLORS["ours"])
    for x, (_, _, goal) in enumerate(shown):
        ax.plot([x - 0.4, x + 0.4], [goal, goal], color="red", lw=1, ls="--")
    if floor := _ok(figures, "floor", "floor"):
        ax.axhline(floor["value"], color=COLORS["sql"], lw=0.8, ls=":", label="writing job's floor")
        ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set(ylabel="runs per second")
    ax.set_title(f"(3) django_periodic executing {plan['execution_runs']:,} pending runs")


def _idle_panel(ax, figures: Figures, peers: list[str], row: str, title: str, goal: float) -> None:
    names, values = [], []
    for peer in peers:
        if f := _ok(figures, row, peer):
            names.append(PEER_COLUMNS[peer])
            values.append(max(f["value"], 1e-3))
    ax.bar(names, values, color=[COLORS[p] for p in peers if _ok(figures, row, p)])
    ax.axhline(goal, color="red", lw=0.8, ls="--", label=f"goal: {goal}")
    ax.set(yscale="log")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"(4) {title}")
    ax.legend(fontsize=7)


def _memory_panel(ax, figures: Figures, plan: dict, peers: list[str]) -> None:
    sizes = plan["rss_sizes"]
    width = 0.8 / max(len(sizes), 1)
    for i, n in enumerate(sizes):
        xs, values = [], []
        for x, peer in enumerate(peers):
            if f := _ok(figures, f"rss:{n}", peer):
                xs.append(x + (i - (len(sizes) - 1) / 2) * width)
                values.append(f["value"])
        ax.bar(
            xs,
            values,
            width,
            label=f"{n:,} schedules",
            alpha=0.6 + 0.4 * i / max(len(sizes) - 1, 1),
        )
    ax.set_xticks(range(len(peers)), [PEER_COLUMNS[p] for p in peers], fontsize=8)
    ax.set(yscale="log", ylabel="MB")
    ax.set_title("(5) scheduler RSS, settled")
    ax.legend(fontsize=7)
