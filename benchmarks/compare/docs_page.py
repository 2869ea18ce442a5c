"""docs/performance.md and its chart, written from the results of a comparison run.

The page is generated whole: the table, the chart, the machine and the reading of the
figures (which goals are met, how far from the machine's limit we are, where a peer could
not finish) all come from the saved results, so they cannot drift apart.
"""

from pathlib import Path

import report
from report import PEER_COLUMNS, Figures

CHART = "docs/images/performance.png"

HOW_TO = """\
## How to reproduce

```
bash benchmarks/compare/run.sh            # everything, 3 repetitions each: about {minutes}
bash benchmarks/compare/run.sh --quick    # 1 repetition, smaller sizes: about 15 minutes
bash benchmarks/compare/run.sh --only planning,idle --peers ours,celery-beat
bash benchmarks/compare/run.sh --only execution-writing,lag-writing --peers ours,apscheduler
```

`run.sh` builds two virtualenvs (`.venv/bench`, Python 3.11, with this project, Django 5.2,
django-celery-beat, Celery, APScheduler 3, SQLAlchemy and matplotlib; `.venv/bench-dpt`,
Python 3.13, which django-periodic-tasks requires), starts a throwaway PostgreSQL 15 with
durability on (`scripts/lib/postgres.sh`, `PG_DURABLE=1`) and PgBouncer in transaction mode
in front of it (`scripts/lib/pgbouncer.sh`; without it only `lag-pgbouncer` is not run), runs
`benchmarks/compare/compare.py` and stops both. Each peer has its own database on that
server and runs in its own process(es); the harness itself only creates rows (one
`INSERT ... SELECT generate_series` per workload, cloned from a template row that the peer's
own ORM made) and watches.
It prints a line per workload and step as it goes, then the table. A full run rewrites this
page and the chart; `--quick` does so only with `--docs`. Results are kept per workload in
`benchmarks/results/compare-*.json`, so `--only` reruns one workload and the page is
regenerated with the others' last figures. `--cap` (600 s) is what a peer gets per run of a
workload; `--no-early-stop` waits out the cap even when the rate seen shows it cannot be met.
"""

DEFINITIONS = """\
## What is measured

Each figure is the median of {reps} runs (a run that took more than {slow:.0f} minutes is not
repeated; the cell says so; idle cost is the median of {reps} windows of one run).
Every peer runs the same workload in the same run, one peer at a time,
except idle cost and memory, where the peers' schedulers run side by side, each measured on
its own process and its own database. A peer that cannot finish a run in {cap:.0f} minutes
gets "did not finish" (with `early stop`, once the rate it has kept for a minute shows it
cannot: the cell gives the projection), and is not run at larger sizes.

1. **Planning throughput.** N schedules (every hour) come due at the same instant, a few
   seconds after the schedulers started and went idle. The figure is N divided by the time
   from the due instant to the last fire out. A fire is: for django_periodic a `Run` row
   inserted (`run_scheduler --plan-only` with `PLAN_AHEAD` 0, so that planning starts at the
   due instant, as the others' does; timed by a statement trigger the harness adds);
   for django-celery-beat a task message published to Celery's in-memory broker; for
   APScheduler a job submitted to its executor (its `EVENT_JOB_SUBMITTED`, including the job
   store update that follows); for django-periodic-tasks a task enqueued into django-tasks'
   in-memory `DummyBackend`. django-periodic-tasks polls (every 15 s by default): its time
   is counted from the poll that found the fires, and the wait for that poll is given
   apart. Beside it, **one SQL statement** does the same inserts and updates as our planner
   (lock the due schedules, move their cursors, insert their runs) on the same rows: the
   machine's limit for this work, and our fraction of it.
2. **Fire lag.** N schedules fire every second for S seconds. Fires kept: the fires whose
   nominal time lies in the S-second window that ran. Lag: for django_periodic
   `Run.started_at - Run.plan_time`, the job's real start (2 schedulers, `--workers 8`,
   shipped defaults: fires are planned and claimed up to `PLAN_AHEAD`, 1 s, before they are
   due and started on their plan time; overlapping fires are skipped and late runs may miss
   their start deadline); for
   django-celery-beat the send time minus the time beat itself held the task due (its
   previous send plus the interval: beat re-anchors each interval at the send, so its lag
   turns into drift, seen as fires not kept); for APScheduler the time its no-op job
   returned minus the scheduled run time (runs later than `misfire_grace_time`, 1 s, are
   dropped as missed). django-periodic-tasks schedules with cron, one minute at the finest,
   so it cannot run this workload. **Through PgBouncer**: the same no-op workload, our
   schedulers' `default` alias through PgBouncer in transaction mode (`default_pool_size`
   20, `DISABLE_SERVER_SIDE_CURSORS`) and a direct alias named in `WAKEUP_DATABASE` for the
   wake-up listener and the session lock, as docs/deployment.md sets them up; the harness
   still counts fires and lags directly.
3. **Execution** (django_periodic only). N pending no-op runs (`tests.jobs.noop`), executed
   by 1 or 2 `run_scheduler --workers 8` processes; runs per second from the first start to
   the last finish.
   Also: **N due at once** with the shipped defaults and one `run_scheduler --workers 8`:
   how many runs succeeded within 10 s of their plan time, how many were skipped (a run not
   started within `misfire_grace`, 60 s, is skipped).
4. **Idle cost.** N schedules, none due for a day; each scheduler started and left
   {settle:.0f} s to settle. Over each window: the database's committed plus rolled-back
   transactions per second (`pg_stat_database`, the peer's own database) and the CPU time of
   the scheduler process (user + system, all threads, from `/proc`) as a % of one core.
   django_periodic runs with its shipped defaults (LISTEN/NOTIFY; idle, it wakes, heartbeats
   and sweeps every `IDLE_INTERVAL`, 120 s, in one transaction), but for `PRUNE_INTERVAL`,
   set to the window's length so that every window includes a retention pass (1 hour by
   default). The database's count also includes the server's own background work in it
   (autovacuum), which the details show as counted on an empty database beside it over the
   same windows. APScheduler 3 sleeps until its next known job and never rereads the job
   store, so it idles at nothing, but does not see a job that another process adds or edits until
   something wakes it; django-celery-beat checks for changes every 5 s and reloads its whole
   schedule every 5 minutes; django-periodic-tasks polls every 15 s.
5. **Memory.** VmRSS of the scheduler process once it is up and has settled, with N
   schedules none of which is due; and how much it grows between the two sizes.
6. **The writing job.** Fire lag, execution, hand-off and N due at once again, with a job
   that writes one row (one INSERT, autocommit) instead of the no-op, under Django's default
   `CONN_MAX_AGE = 0` (the no-op rows keep the test settings' 60 s). For django_periodic it
   is `tests.jobs.record` (`Execution.objects.create`); for APScheduler 3 a job in its thread
   pool doing the same INSERT with psycopg on a connection per executor thread, kept open
   (what a user of its thread pool would write); APScheduler's execution figure is N jobs due
   at once (a misfire grace of an hour, so that none is dropped), from the due time to the
   last job done. django-celery-beat only sends tasks and django-periodic-tasks only
   enqueues them: neither executes a job, so neither has a writing-job figure. Also, with
   the writing job: 2 schedulers, {steady} schedules every second for {steady_seconds} s, no
   kills: how many of the runs succeeded. **The floor** is that job's limit: the same
   `Execution.objects.create` in a plain loop on one connection (autocommit, this durable
   server), {floor_rows:,} rows, measured in the same run; the hand-off throughputs are also
   given as a fraction of it. **The limit** of each of our writing-job lag, execution and
   due-at-once figures is measured beside each of its runs: the same rows as that INSERT,
   with no scheduler, in as many processes as the workload's schedulers, each with as many
   threads (and connections) as their `--workers` (`benchmarks/compare/limit_child.py`). For
   execution, N rows split over the threads, all released together; for fire lag, at every
   second the N rows of that second queued for the threads, the lag being when each INSERT
   began minus its second; for due at once, N rows queued at once, the time until the last
   is done. Each figure is given as a fraction or a multiple of its limit (the median of
   each run's own ratio), and its goal is stated against it. **The atomic writing job**
   (`tests.jobs.atomic_record`, `@job(atomic=True)`):
   the same row, committed with the run's success; its lag, execution and due-at-once rows
   have the same limits.

Peers, all on their defaults unless said here: django-celery-beat's `DatabaseScheduler` in a
`celery beat` service with the in-memory broker (nothing consumes the messages; a beat
stopped cleanly writes every sent entry back, so it is killed instead); APScheduler 3's
`BackgroundScheduler` with its `SQLAlchemyJobStore` (psycopg 3) and thread pool;
django-periodic-tasks' `run_scheduler` command. The other peers are instrumented only by
logging events around their own code (a subclass of the scheduler for django-celery-beat and
django-periodic-tasks, APScheduler's event listeners); nothing they do is changed. The
timestamps all come from the one machine clock that PostgreSQL also uses.

Not measured, and why: two schedulers for django-celery-beat and APScheduler 3 (neither
supports it: their docs say a second one duplicates fires); fire lag for
django-periodic-tasks (cron only, one minute at the finest, so no schedule every second);
no-op execution for the peers (the issue measures ours only: their tasks go to a broker or
an executor this comparison does not time); the writing job for django-celery-beat and
django-periodic-tasks (they send or enqueue tasks, they execute none).
"""


def write(root: Path, results: dict, figures: Figures, peers: list[str]) -> None:
    plan = results["plan"]
    report.chart(figures, plan, peers, root / CHART)
    text = page(results, figures, peers)
    (root / "docs" / "performance.md").write_text(text)
    print(f"Wrote docs/performance.md and {CHART}")


def when(ran: list[str]) -> str:
    """When the workloads ran, as a span ("2026-12-02, 08:29 to 10:02 UTC"): the page says
    how fresh its figures are, and git keeps which code they measured."""
    first, last = ran[0], ran[-1]
    day, start = first.removesuffix(" UTC").split(" ")
    end_day, end = last.removesuffix(" UTC").split(" ")
    if end_day != day:
        return f"{first} to {last}"
    return f"{day}, {start} to {end} UTC" if start != end else first


def page(results: dict, figures: Figures, peers: list[str]) -> str:
    plan, machine = results["plan"], results["machine"]
    mode = "quick run (1 repetition, smaller sizes)" if plan["quick"] else "full run"
    ran = sorted({entry["ran_at"] for entry in results["workloads"].values()})
    parts = [
        "# Performance beside the peers",
        "",
        "How django_periodic compares with django-celery-beat, APScheduler 3 and "
        "django-periodic-tasks on one machine and one PostgreSQL, and how it stands against "
        "its own goals. Generated by `bash benchmarks/compare/run.sh`; do not edit by hand.",
        "",
        f"**Figures from a {mode}**, {when(ran)}. "
        "The harness stays; rerun it after a change that may move a figure.",
        "",
        "## Results",
        "",
        report.markdown_table(figures, plan, peers),
        "",
        report.CRASH_NOTE,
        "",
        f"![planning, fire lag, execution, idle cost and memory]({CHART.removeprefix('docs/')})",
        "",
        "Details:",
        "",
        *report.details(figures, plan),
        "",
        "## Reading the figures",
        "",
        *reading(figures, plan, peers),
        "",
        "## The machine",
        "",
        # Not the commit: the page shows current figures, and git keeps which code they were.
        *(f"- {key}: {value}" for key, value in machine.items() if key != "commit"),
        "",
        "Each limit in the table was measured on this machine in the same run as the figure "
        "beside it: the machine's state of that moment is in both.",
        "",
        DEFINITIONS.format(
            reps=plan["reps"],
            slow=plan["slow_repetition"] / 60,
            cap=plan["cap"] / 60,
            settle=plan["settle"],
            steady=plan.get("steady_schedules", 100),
            steady_seconds=plan.get("steady_seconds", 30),
            floor_rows=plan.get("floor_rows", 10_000),
        ),
        HOW_TO.format(minutes="an hour"),
    ]
    return "\n".join(parts)


# --- the reading, sentence by sentence from the figures ----------------------------------------


def reading(figures: Figures, plan: dict, peers: list[str]) -> list[str]:
    lines = goal_lines(figures, plan)
    lines += planning_lines(figures, plan, peers)
    lines += lag_lines(figures, peers)
    lines += writing_lines(figures, peers)
    lines += idle_lines(figures, peers)
    lines += memory_lines(figures, plan, peers)
    lines += unfinished_lines(figures, plan)
    return lines


def goal_lines(figures: Figures, plan: dict) -> list[str]:
    met, missed = [], []
    for row in report.rows_for(plan):
        figure = figures.get((row.key, "ours"))
        if not row.goal or figure is None:
            continue
        ok = figure["status"] == "ok" and row.met is not None and row.met(figure)
        text = report.cell(figure, plan)  # with each run's p99 where the goal needs them
        (met if ok else missed).append(f"{row.label}: {text} (goal: {row.goal})")
    lines = []
    if missed:
        lines += [f"**Goals missed ({len(missed)} of {len(missed) + len(met)}):**", ""]
        lines += [f"- {line}" for line in missed] + [""]
    if met:
        lines += [f"Goals met ({len(met)}):", ""] + [f"- {line}" for line in met] + [""]
    return lines


def planning_lines(figures: Figures, plan: dict, peers: list[str]) -> list[str]:
    lines = []
    for n in plan["planning_sizes"]:
        ours = _value(figures, f"planning:{n}:1", "ours")
        two = _value(figures, f"planning:{n}:2", "ours")
        sql = _value(figures, f"planning:{n}:1", "sql")
        if ours is None:
            continue
        sentence = f"Planning {n:,} due at once, django_periodic makes {ours:,.0f} fires/s"
        if two is not None:
            sentence += f" ({two:,.0f} with two schedulers)"
        if sql:
            sentence += (
                f", {ours / sql:.0%} of what one SQL statement does on the same rows ({sql:,.0f}/s)"
            )
        others = [
            f"{ours / value:.1f}x {PEER_COLUMNS[peer]}"
            for peer in peers
            if peer != "ours" and (value := _value(figures, f"planning:{n}:1", peer))
        ]
        if others:
            sentence += "; that is " + ", ".join(others)
        lines.append(f"- {sentence}.")
    return lines


def lag_lines(figures: Figures, peers: list[str]) -> list[str]:
    lines = []
    for peer in peers:
        figure = figures.get(("lag", peer))
        if figure and figure["status"] == "ok":
            lines.append(f"- Fire lag, {PEER_COLUMNS[peer]}: {figure['text']}.")
    return lines


def writing_lines(figures: Figures, peers: list[str]) -> list[str]:
    """The writing jobs' throughput beside its limit measured in the same run (in results
    saved before there was one, beside the floor), per peer that executes jobs."""
    floor = _value(figures, "floor", "floor")
    lines = []
    for peer in peers:
        for key, job in report.WRITING_JOBS:
            parts = [
                part
                for processes in (1, 2)
                if (part := _writing_part(figures, f"execution:{key}:{processes}", peer, floor))
            ]
            if parts:
                lines.append(f"- {job.capitalize()}, {PEER_COLUMNS[peer]}: {'; '.join(parts)}.")
    if lines and floor:
        lines.append(f"- The writing job's floor, its INSERT in a loop: {floor:,.0f} rows/s.")
    return lines


def _writing_part(figures: Figures, row: str, peer: str, floor: float | None) -> str:
    if (rate := _value(figures, row, peer)) is None:
        return ""
    numbers = figures[row, peer]["numbers"]
    processes = int(row.rsplit(":", 1)[1])
    text = f"{rate:,.0f} runs/s with {processes} process{'es' * (processes > 1)}"
    if numbers.get("limit_rate"):
        ratio, limit = report.of_limit(numbers), report.limit_text(numbers)
        return text + f" ({ratio:.2f} of the limit, {limit})"
    # The floor of the figure's own run: --only reruns measure it anew.
    own = numbers.get("floor") or floor
    return text + (f" ({rate / own:.2f} of the floor)" if own else "")


def idle_lines(figures: Figures, peers: list[str]) -> list[str]:
    parts = []
    for peer in peers:
        xacts, cpu = _value(figures, "idle:xacts", peer), _value(figures, "idle:cpu", peer)
        if xacts is not None and cpu is not None:
            parts.append(f"{PEER_COLUMNS[peer]} {xacts:.2f} transactions/s and {cpu:.3f} % CPU")
    return [f"- Idle: {'; '.join(parts)}."] if parts else []


def memory_lines(figures: Figures, plan: dict, peers: list[str]) -> list[str]:
    low, high = plan["rss_sizes"][0], plan["rss_sizes"][-1]
    parts = []
    for peer in peers:
        growth = _value(figures, "rss:growth", peer)
        if growth is not None:
            parts.append(f"{PEER_COLUMNS[peer]} {growth:+,.0f} MB")
        elif (figure := figures.get((f"rss:{high}", peer))) and figure["status"] != "ok":
            parts.append(f"{PEER_COLUMNS[peer]}: {figure['text']}")
    if not parts:
        return []
    return [f"- Memory from {low:,} to {high:,} schedules: {'; '.join(parts)}."]


def unfinished_lines(figures: Figures, plan: dict) -> list[str]:
    labels = {row.key: row.label for row in report.rows_for(plan)}
    lines = []
    for (row, peer), figure in sorted(figures.items()):
        if figure["status"] in ("dnf", "error") and row in labels:
            name = PEER_COLUMNS.get(peer, peer)
            lines.append(f"- {name}, {labels[row]}: {figure['text']}.")
    return lines


def _value(figures: Figures, row: str, peer: str) -> float | None:
    figure = figures.get((row, peer))
    return figure["value"] if figure and figure["status"] == "ok" else None
