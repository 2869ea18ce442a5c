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
    n, s = plan["lag_schedules"], plan["lag_seconds"]
    rows.append(
        Row(
            "lag",
            f"(2) fire lag: {n:,} schedules x every 1 s x {s} s (ours: 2 schedulers)",
            f"all {n * s:,} succeeded, p99 <= 50 ms",
            lambda f: (
                f["numbers"]["kept"] == f["numbers"]["expected"] and f["numbers"]["p99"] <= 50
            ),
        )
    )
    runs = plan["execution_runs"]
    rows.append(
        Row(
            "execution:1",
            f"(3) execution: {runs:,} pending no-op runs, 1 process",
            ">= 2,000 runs/s",
            _at_least(2_000),
        )
    )
    rows.append(
        Row(
            "execution:2",
            f"(3) execution: {runs:,} pending no-op runs, 2 processes",
            ">= 3,000 runs/s",
            _at_least(3_000),
        )
    )
    runs = plan.get("handoff_runs", 0)
    for workers in (1, 4):
        plural = "s" * (workers > 1)
        rows.append(
            Row(
                f"handoff:{workers}",
                f"(3) hand-off: {runs:,} no-op runs via django-tasks-db, "
                f"{workers} db_worker{plural}",
            )
        )
    n = plan["due_schedules"]
    rows.append(
        Row(
            "due",
            f"{n:,} due at once, default settings, one run_scheduler --workers {plan['workers']}",
            f"all {n:,} succeeded within 10 s of the fire",
            lambda f: f["numbers"]["within"] >= f["numbers"]["n"],
        )
    )
    n = plan["idle_schedules"]
    rows.append(
        Row(
            "idle:xacts",
            f"(4) idle, {n:,} schedules not due: database transactions",
            "<= 0.05 /s",
            _at_most(0.05),
        )
    )
    rows.append(
        Row(
            "idle:cpu",
            f"(4) idle, {n:,} schedules not due: CPU of the scheduler process",
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


def markdown_table(figures: Figures, plan: dict, peers: list[str]) -> str:
    columns = [key for key in PEER_COLUMNS if key in peers and key != "ours"]
    head = ["workload", "goal (ours)", "django_periodic", "goal met"]
    head += [PEER_COLUMNS[key] for key in columns] + ["one SQL statement (machine limit)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows_for(plan):
        ours = figures.get((row.key, "ours"))
        cells = [row.label, row.goal, ours_cell(row, figures, plan), goal_status(row, ours)]
        cells += [cell(figures.get((row.key, key)), plan) for key in columns]
        sql = figures.get((row.key, "sql"))
        cells.append(cell(sql, plan) if sql else "")
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
    names, values = [], []
    for processes, goal in ((1, 2_000), (2, 3_000)):
        if f := _ok(figures, f"execution:{processes}", "ours"):
            names.append(f"{processes} process{'es' * (processes > 1)}\n(goal {goal:,})")
            values.append(f["value"])
    ax.bar(names, values, color=COLORS["ours"])
    for x, goal in enumerate((2_000, 3_000)[: len(names)]):
        ax.plot([x - 0.4, x + 0.4], [goal, goal], color="red", lw=1, ls="--")
    ax.set(ylabel="runs per second")
    ax.set_title(f"(3) django_periodic executing {plan['execution_runs']:,} no-op runs")


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
