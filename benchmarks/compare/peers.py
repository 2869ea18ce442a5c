"""The schedulers compared, each behind the same small interface.

A peer owns one database on the benchmark's server, creates N schedules there in one
statement (cloned from a template row its own ORM made), starts its scheduler processes and
says how many fires they produced. django_periodic's fires are Run rows (counted by a
statement-level trigger the harness adds); the other peers' processes append events to a
file (peer_events.py).
"""

import json
import os
import pickle
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from harness import (
    TEMPLATE_PREFIX,
    Child,
    EventLog,
    Server,
    clone_rows,
    keep_as_template,
    run_checked,
    spawn,
    table_columns,
    truncate,
    vacuum_analyze,
)

COMPARE_DIR = Path(__file__).resolve().parent
# The shipped default poll interval (django_periodic/conf.py); tests.settings polls every 1 s.
OURS_DEFAULT_SETTINGS = {"POLL_INTERVAL": 5}


@dataclass
class Context:
    """What every peer needs: the server, the interpreters and where to put logs."""

    server: Server
    root: Path
    work: Path
    python: str
    dpt_python: str | None
    leads: dict[tuple[str, int], float] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERIODIC_", "BENCH_"))}
        env["PYTHONPATH"] = f"{self.root}{os.pathsep}{COMPARE_DIR}"
        env["BENCH_PG_PORT"] = str(self.server.port)
        env.update(extra)
        return env


class Peer:
    """A scheduler under test. Subclasses fill in the specifics."""

    key = ""
    label = ""
    database = ""
    tables: tuple[str, ...] = ()
    multi = False  # may several scheduler processes share one schedule table?
    multi_note = ""
    min_interval = timedelta(0)
    plan_kind = "sent"  # the event counted as a fire when planning
    lag_kind = "sent"  # the event whose time is compared with the nominal time
    lag_definition = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._conn: psycopg.Connection | None = None
        self.logs: list[EventLog] = []

    # -- database --

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self.ctx.server.connect(self.database)
        return self._conn

    def prepare(self) -> None:
        """Create the database, the peer's tables and its template row(s)."""
        raise NotImplementedError

    def reset(self) -> None:
        truncate(self.conn, self.tables)

    def analyze(self) -> None:
        vacuum_analyze(self.conn, self.tables)

    def add_schedules(
        self, n: int, first: datetime, every: timedelta, last: datetime | None = None
    ) -> None:
        """N schedules that fire at ``first`` and every ``every`` after it (until ``last``)."""
        raise NotImplementedError

    # -- processes --

    def start(self, index: int, **options: object) -> Child:
        raise NotImplementedError

    def _spawn(self, index: int, argv: list[str], env: dict[str, str]) -> Child:
        log = EventLog(self.ctx.work / "events" / f"{self.key}-{index}.log")
        log.reset()
        if index == 0:
            self.logs = []
        self.logs.append(log)
        env = {**env, "BENCH_EVENTS": str(log.path)}
        return spawn(f"{self.key}-{index}", argv, env, self.ctx.root, self.ctx.work / "logs")

    def stop(self, children: list[Child]) -> None:
        for child in children:
            child.stop()

    def ready(self, children: list[Child]) -> bool:
        return all(log.count("ready") for log in self.logs[: len(children)])

    # -- fires --

    def fired(self, kind: str) -> int:
        return sum(log.count(kind) for log in self.logs)

    def fires(self, kind: str) -> list[tuple[float, float]]:
        """(nominal time, event time) of every fire of that kind, in Unix seconds."""
        return [(e[0], e[1]) for log in self.logs for e in log.events(kind)]

    def last_fire(self, kind: str) -> float:
        return max(at for _, at in self.fires(kind))

    def work_started(self, due_at: float) -> float:
        """When the scheduler began on fires due at ``due_at``: it sleeps until then."""
        return due_at


class Ours(Peer):
    """django_periodic: ``python -m django run_scheduler``, tests.settings, shipped defaults."""

    key = "ours"
    label = "django_periodic"
    database = "bench_ours"
    tables = (
        "django_periodic_lease",
        "django_periodic_run",
        "django_periodic_schedule",
        "django_periodic_schedulerprocess",
        "django_tasks_database_dbtaskresult",
        "bench_run_inserts",
    )
    multi = True
    lag_definition = (
        "`Run.started_at - Run.plan_time`: when the job was called, on the database's clock "
        "(the claim's time plus the time since)"
    )

    def env(self) -> dict[str, str]:
        return self.ctx.env(
            DJANGO_SETTINGS_MODULE="tests.settings",
            PERIODIC_TEST_DB="postgres",
            PERIODIC_TEST_POSTGRES_URL=self.ctx.server.url(self.database),
            PERIODIC_TEST_DB_NAME=self.database,
            PERIODIC_TEST_SETTINGS=json.dumps(OURS_DEFAULT_SETTINGS),
        )

    def prepare(self) -> None:
        self.ctx.server.create_database(self.database)
        python, env, root = self.ctx.python, self.env(), self.ctx.root
        run_checked([python, "-m", "django", "migrate", "-v", "0"], env, root, "ours: migrate")
        run_checked([python, str(COMPARE_DIR / "ours_child.py")], env, root, "ours: template")
        keep_as_template(self.conn, "django_periodic_run", "true")
        keep_as_template(self.conn, "django_periodic_schedule", "true")
        self._log_run_inserts()

    def _log_run_inserts(self) -> None:
        """A statement-level trigger that records when runs were inserted, and how many:
        planning progress and its end, without counting a growing table while it grows."""
        self.conn.execute(
            "CREATE TABLE bench_run_inserts (at timestamptz NOT NULL, n int NOT NULL)"
        )
        self.conn.execute(
            "CREATE FUNCTION bench_log_run_inserts() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO bench_run_inserts SELECT clock_timestamp(), count(*) FROM new_rows; "
            "RETURN NULL; END $$"
        )
        self.conn.execute(
            "CREATE TRIGGER bench_run_inserts AFTER INSERT ON django_periodic_run "
            "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
            "EXECUTE FUNCTION bench_log_run_inserts()"
        )

    def add_schedules(
        self,
        n: int,
        first: datetime,
        every: timedelta,
        last: datetime | None = None,
        misfire_grace: timedelta | None = None,
    ) -> None:
        overrides = {
            "name": "'bench-' || g",
            "enabled": "true",
            "interval": "%(every)s",
            "start_at": "%(first)s",
            "next_fire_at": "%(first)s",
            "end_at": "%(last)s",
            "created_at": "statement_timestamp()",
            "updated_at": "statement_timestamp()",
        }
        if misfire_grace is not None:
            overrides["misfire_grace"] = "%(grace)s"
        params = {"every": every, "first": first, "last": last, "grace": misfire_grace}
        clone_rows(self.conn, "django_periodic_schedule", n, overrides, params)

    def start(self, index: int, *, workers: int | None = None, plan_only: bool = False) -> Child:
        argv = [self.ctx.python, "-m", "django", "run_scheduler", "-v", "0"]
        argv += ["--plan-only"] if plan_only else []
        argv += ["--workers", str(workers)] if workers else []
        env = self.env()
        if plan_only:
            # Planning throughput is timed from the due time: no head start from PLAN_AHEAD.
            env["PERIODIC_TEST_SETTINGS"] = json.dumps({**OURS_DEFAULT_SETTINGS, "PLAN_AHEAD": 0})
        return self._spawn(index, argv, env)

    def start_task_worker(self, index: int) -> Child:
        """A django-tasks-db ``db_worker`` of the "database" backend (tests.settings.TASKS),
        executing the runs handed to it."""
        argv = [self.ctx.python, "-m", "django", "db_worker", "-v", "0"]
        argv += ["--backend", "database", "--interval", "0.05", "--no-startup-delay"]
        return self._spawn(index, argv, self.env())

    def hand_off_pending(self, backend: str = "database") -> int:
        """Route every pending run to a tasks backend, as if its schedule named it."""
        return self.conn.execute(
            "UPDATE django_periodic_run SET tasks_backend = %s WHERE status = 'pending'",
            [backend],
        ).rowcount

    def plan_once(self) -> None:
        """``run_scheduler --plan-only --once``: plan what is due now, then exit."""
        argv = [
            self.ctx.python,
            "-m",
            "django",
            "run_scheduler",
            "--plan-only",
            "--once",
            "-v",
            "0",
        ]
        run_checked(argv, self.env(), self.ctx.root, "ours: plan")

    def ready(self, children: list[Child]) -> bool:
        row = self.conn.execute("SELECT count(*) FROM django_periodic_schedulerprocess").fetchone()
        return row[0] >= len(children)

    def fired(self, kind: str = "") -> int:
        return int(
            self.conn.execute("SELECT coalesce(sum(n), 0) FROM bench_run_inserts").fetchone()[0]
        )

    def last_fire(self, kind: str = "") -> float:
        row = self.conn.execute(
            "SELECT extract(epoch FROM max(at)) FROM bench_run_inserts"
        ).fetchone()
        return float(row[0])

    def count_runs(self, where: str = "true") -> int:
        return int(
            self.conn.execute(f"SELECT count(*) FROM django_periodic_run WHERE {where}").fetchone()[
                0
            ]
        )

    def plan_in_one_statement(self) -> int:
        """The planning of every due schedule as one hand-written statement: lock the due
        schedules, move their cursors, insert their runs. Returns the rows inserted."""
        moved = {
            "schedule_id": "m.id",
            "plan_time": "m.plan_time",
            "trigger": "'schedule'",
            "status": "'pending'",
            "attempt": "0",
            "max_attempts": "m.max_attempts",
            "job_name": "m.job",
            "args": "m.args",
            "kwargs": "m.kwargs",
            "exclusive": "m.overlap <> 'concurrent'",
            "start_deadline": "m.plan_time + m.misfire_grace",
            "created_at": "statement_timestamp()",
        }
        columns = table_columns(self.conn, "django_periodic_run")
        values = ", ".join(moved.get(c, f't."{c}"') for c in columns)
        statement = f"""
            WITH due AS (
                SELECT id, next_fire_at FROM django_periodic_schedule
                WHERE enabled AND next_fire_at <= statement_timestamp()
                FOR UPDATE SKIP LOCKED
            ), m AS (
                UPDATE django_periodic_schedule AS s
                SET next_fire_at = due.next_fire_at + s.interval, updated_at = statement_timestamp()
                FROM due WHERE s.id = due.id
                RETURNING s.id, due.next_fire_at AS plan_time, s.job, s.args, s.kwargs,
                    s.max_attempts, s.overlap, s.misfire_grace
            )
            INSERT INTO django_periodic_run ({", ".join(f'"{c}"' for c in columns)})
            SELECT {values} FROM m CROSS JOIN {TEMPLATE_PREFIX}django_periodic_run AS t
        """
        return self.conn.execute(statement).rowcount


class CeleryBeat(Peer):
    """django-celery-beat's DatabaseScheduler in `celery beat`, in-memory broker."""

    key = "celery-beat"
    label = "django-celery-beat"
    database = "bench_celery_beat"
    tables = ("django_celery_beat_periodictask",)
    multi_note = "one beat only: a second sends every task again (docs)"
    lag_definition = (
        "task sent minus when beat itself held it due (its previous send plus the "
        "interval: beat re-anchors intervals at each send, so lag turns into drift)"
    )

    def env(self) -> dict[str, str]:
        return self.ctx.env(DJANGO_SETTINGS_MODULE="beat_settings", BENCH_DB=self.database)

    def prepare(self) -> None:
        self.ctx.server.create_database(self.database)
        python, env, root = self.ctx.python, self.env(), self.ctx.root
        run_checked([python, "-m", "django", "migrate", "-v", "0"], env, root, "beat: migrate")
        run_checked(
            [python, str(COMPARE_DIR / "beat_child.py"), "template"], env, root, "beat: template"
        )
        keep_as_template(self.conn, "django_celery_beat_periodictask", "name = 'bench-template'")

    def add_schedules(
        self, n: int, first: datetime, every: timedelta, last: datetime | None = None
    ) -> None:
        interval = self.conn.execute(
            "INSERT INTO django_celery_beat_intervalschedule (every, period) "
            "VALUES (%s, 'seconds') RETURNING id",
            (int(every.total_seconds()),),
        ).fetchone()[0]
        overrides = {
            "name": "'bench-' || g",
            "enabled": "true",
            "interval_id": "%(interval)s",
            "last_run_at": "%(last_run)s",  # so that the first fire is due at `first`
            "date_changed": "statement_timestamp()",
            "total_run_count": "0",
        }
        params = {"interval": interval, "last_run": first - every}
        clone_rows(self.conn, "django_celery_beat_periodictask", n, overrides, params)

    def start(self, index: int, **options: object) -> Child:
        argv = [self.ctx.python, str(COMPARE_DIR / "beat_child.py"), "run"]
        return self._spawn(index, argv, self.env())

    def stop(self, children: list[Child]) -> None:
        # A clean stop writes every sent entry back one row at a time: not measured here.
        for child in children:
            child.kill()


class APScheduler(Peer):
    """APScheduler 3, BackgroundScheduler + SQLAlchemyJobStore, in its own process."""

    key = "apscheduler"
    label = "APScheduler 3"
    database = "bench_apscheduler"
    tables = ("apscheduler_jobs",)
    multi_note = "one scheduler per job store (FAQ: sharing one duplicates or misses jobs)"
    plan_kind = "submit"
    lag_kind = "run"
    lag_definition = (
        "job executed (a no-op, in the thread pool) minus its scheduled run time; run "
        "times later than misfire_grace_time (1 s) are dropped as missed, not run"
    )

    def prepare(self) -> None:
        self.ctx.server.create_database(self.database)
        # The table SQLAlchemyJobStore creates (id Unicode(191), next_run_time Float(25)).
        self.conn.execute(
            "CREATE TABLE apscheduler_jobs (id varchar(191) PRIMARY KEY, "
            "next_run_time double precision, job_state bytea NOT NULL)"
        )
        self.conn.execute(
            "CREATE INDEX ix_apscheduler_jobs_next_run_time ON apscheduler_jobs (next_run_time)"
        )

    def add_schedules(
        self, n: int, first: datetime, every: timedelta, last: datetime | None = None
    ) -> None:
        state = self._job_state(first, every, last)
        with (
            self.conn.cursor() as cursor,
            cursor.copy("COPY apscheduler_jobs (id, next_run_time, job_state) FROM STDIN") as copy,
        ):
            for i in range(1, n + 1):
                state["id"] = f"bench-{i}"
                copy.write_row(
                    (state["id"], first.timestamp(), pickle.dumps(state, pickle.HIGHEST_PROTOCOL))
                )

    @staticmethod
    def _job_state(first: datetime, every: timedelta, last: datetime | None) -> dict:
        """A job as ``add_job`` would store it, with APScheduler's default job options."""
        from apscheduler.job import Job
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        trigger = IntervalTrigger(
            seconds=every.total_seconds(), start_date=first, end_date=last, timezone=UTC
        )
        job = Job(
            BackgroundScheduler(timezone=UTC),  # not started: only lends its time zone
            id="template",
            func="aps_jobs:noop",
            trigger=trigger,
            executor="default",
            args=(),
            kwargs={},
            name="noop",
            misfire_grace_time=1,
            coalesce=True,
            max_instances=1,
            next_run_time=first,
        )
        return job.__getstate__()

    def start(self, index: int, **options: object) -> Child:
        url = self.ctx.server.url(self.database, scheme="postgresql+psycopg")
        env = self.ctx.env(BENCH_SQLALCHEMY_URL=url)
        return self._spawn(index, [self.ctx.python, str(COMPARE_DIR / "aps_child.py")], env)


class PeriodicTasks(Peer):
    """django-periodic-tasks' run_scheduler command (default 15 s poll), django-tasks
    DummyBackend. Needs Python >= 3.13, so it runs from its own venv."""

    key = "dpt"
    label = "django-periodic-tasks"
    database = "bench_dpt"
    tables = ("django_periodic_tasks_scheduledtask", "django_periodic_tasks_taskexecution")
    multi = True
    min_interval = timedelta(minutes=1)
    lag_definition = "task enqueued minus its next_run_at (cron only: no sub-minute schedules)"

    @property
    def python(self) -> str:
        if not self.ctx.dpt_python:
            raise RuntimeError("django-periodic-tasks venv missing (.venv/bench-dpt)")
        return self.ctx.dpt_python

    def env(self) -> dict[str, str]:
        return self.ctx.env(DJANGO_SETTINGS_MODULE="dpt_settings", BENCH_DB=self.database)

    def prepare(self) -> None:
        self.ctx.server.create_database(self.database)
        env, root = self.env(), self.ctx.root
        run_checked([self.python, "-m", "django", "migrate", "-v", "0"], env, root, "dpt: migrate")
        run_checked(
            [self.python, str(COMPARE_DIR / "dpt_child.py"), "template"], env, root, "dpt: template"
        )
        keep_as_template(
            self.conn, "django_periodic_tasks_scheduledtask", "name = 'bench-template'"
        )

    def add_schedules(
        self, n: int, first: datetime, every: timedelta, last: datetime | None = None
    ) -> None:
        # Each schedule fires at `first`; its cron (yearly) puts the next fire far away.
        overrides = {
            "name": "'bench-' || g",
            "enabled": "true",
            "next_run_at": "%(first)s",
            "created_at": "statement_timestamp()",
            "updated_at": "statement_timestamp()",
        }
        clone_rows(self.conn, "django_periodic_tasks_scheduledtask", n, overrides, {"first": first})

    def start(self, index: int, **options: object) -> Child:
        return self._spawn(
            index, [self.python, str(COMPARE_DIR / "dpt_child.py"), "run"], self.env()
        )

    def work_started(self, due_at: float) -> float:
        """It polls (every 15 s by default): work starts with the first poll after the due time."""
        ticks = [at for log in self.logs for (at,) in log.events("tick") if at >= due_at - 0.05]
        return min(ticks, default=due_at)


PEERS: dict[str, type[Peer]] = {
    "ours": Ours,
    "celery-beat": CeleryBeat,
    "apscheduler": APScheduler,
    "dpt": PeriodicTasks,
}


def now_utc(offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(time.time() + offset, UTC)
