"""Plumbing shared by the comparison: the PostgreSQL server, row cloning, child processes,
/proc probes, event logs written by the peers' processes, progress lines and statistics.

Nothing here knows about a particular scheduler; peers.py does.
"""

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TEMPLATE_PREFIX = "bench_template_"


# --- PostgreSQL -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """The throwaway PostgreSQL server started by run.sh (trust auth, user postgres)."""

    port: int
    host: str = "127.0.0.1"

    def url(self, database: str, scheme: str = "postgres") -> str:
        return f"{scheme}://postgres@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection:
        """An autocommit connection: every statement is its own transaction."""
        return psycopg.connect(self.url(database), autocommit=True)

    def create_database(self, name: str) -> None:
        """(Re)create an empty database."""
        with self.connect() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def transactions(self, database: str) -> int:
        """Commits plus rollbacks counted for a database so far (cumulative statistics)."""
        with self.connect() as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                (database,),
            ).fetchone()
        return int(row[0]) if row else 0

    def version(self) -> str:
        with self.connect() as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def settings(self, names: Sequence[str]) -> dict[str, str]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(names),)
            ).fetchall()
        return dict(rows)


def table_columns(conn: psycopg.Connection, table: str) -> list[str]:
    """The columns of a table in order, without its serial primary key ``id``."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    if not rows:
        raise LookupError(f"no table {table}")
    return [name for (name,) in rows if name != "id"]


def keep_as_template(conn: psycopg.Connection, table: str, where: str) -> None:
    """Move the row(s) matching ``where`` from ``table`` into a side table to clone from.

    Templates are made by the peer's own ORM, so every column gets the default the peer
    would give it, including columns added after this harness was written.
    """
    template = sql.Identifier(TEMPLATE_PREFIX + table)
    source = sql.Identifier(table)
    condition = sql.SQL(where)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(template))
    conn.execute(
        sql.SQL("CREATE TABLE {} AS SELECT * FROM {} WHERE {}").format(template, source, condition)
    )
    conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(source, condition))


def clone_rows(
    conn: psycopg.Connection,
    table: str,
    count: int,
    overrides: dict[str, str],
    params: dict[str, Any] | None = None,
) -> None:
    """Insert ``count`` copies of the template row in one statement (``generate_series``).

    ``overrides`` maps a column to an SQL expression that may use ``g`` (1..count) and
    ``%(name)s`` parameters; every other column is copied from the template.
    """
    columns = table_columns(conn, table)
    unknown = set(overrides) - set(columns)
    if unknown:
        raise LookupError(f"{table} has no column(s) {sorted(unknown)}")
    values = [
        sql.SQL(overrides[name]) if name in overrides else sql.Identifier("t", name)
        for name in columns
    ]
    statement = sql.SQL(
        "INSERT INTO {table} ({columns}) SELECT {values} "
        "FROM {template} AS t CROSS JOIN generate_series(1, %(count)s) AS g"
    ).format(
        table=sql.Identifier(table),
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        values=sql.SQL(", ").join(values),
        template=sql.Identifier(TEMPLATE_PREFIX + table),
    )
    conn.execute(statement, {**(params or {}), "count": count})


def truncate(conn: psycopg.Connection, tables: Iterable[str]) -> None:
    names = sql.SQL(", ").join(map(sql.Identifier, tables))
    conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(names))


def vacuum_analyze(conn: psycopg.Connection, tables: Iterable[str]) -> None:
    """Fresh statistics after a bulk load, as a production table has, and no autovacuum
    kicking in during a measurement."""
    for table in tables:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


# --- child processes --------------------------------------------------------------------------


@dataclass
class Child:
    """A scheduler process under test, in its own process group."""

    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if not self.alive():
                return
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL at once: for peers whose graceful stop would write back a whole schedule."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.popen.wait(30)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, argv: list[str], env: dict[str, str], cwd: Path, log_dir: Path) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("w") as out:
        popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, popen, log)


def run_checked(argv: list[str], env: dict[str, str], cwd: Path, what: str) -> None:
    """Run a short setup command (migrate, template); raise with its output if it fails."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


# --- /proc probes -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values


# --- event logs -------------------------------------------------------------------------------


@dataclass
class EventLog:
    """Lines a peer's process appends as things happen: ``<kind> <float> <float>...``.

    Kinds: ``ready <at>`` (scheduler up and idle), ``tick <at>`` (a poll started),
    ``fire <nominal> <at>`` (a task sent / job submitted / job executed), ``missed <nominal> <at>``.
    Times are Unix seconds from the same clock as the database's (one machine).
    """

    path: Path
    _offset: int = 0
    _partial: bytes = b""
    _events: dict[str, list[tuple[float, ...]]] = field(default_factory=dict)

    def reset(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")
        self._offset, self._partial, self._events = 0, b"", {}

    def read(self) -> None:
        """Take in what was appended since the last read."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            kind, *numbers = line.decode().split()
            self._events.setdefault(kind, []).append(tuple(float(n) for n in numbers))

    def count(self, kind: str) -> int:
        self.read()
        return len(self._events.get(kind, ()))

    def events(self, kind: str) -> list[tuple[float, ...]]:
        self.read()
        return list(self._events.get(kind, ()))


# --- waiting and progress ---------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class Progress:
    """One line per step; while waiting, a line rewritten in place on a terminal (or one
    every 15 s in a log)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self._tty = sys.stdout.isatty()
        self._last_line = 0.0

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        elapsed = time.monotonic() - self.started
        if not self._tty and elapsed - self._last_line < 15:
            return
        self._last_line = elapsed
        width = 24
        if total:
            filled = min(width, int(width * done / total))
            bar = "#" * filled + "." * (width - filled)
            text = f"  {self.label} [{bar}] {done:,}/{total:,} {elapsed:4.0f}s {note}"
        else:
            text = f"  {self.label} {elapsed:4.0f}s {note}"
        if self._tty:
            sys.stdout.write("\r" + text[:120].ljust(120))
        else:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def finish(self, result: str) -> None:
        elapsed = time.monotonic() - self.started
        text = f"  {self.label}: {result} ({elapsed:.0f} s)"
        sys.stdout.write(("\r" + text.ljust(120) if self._tty else text) + "\n")
        sys.stdout.flush()


def say(text: str) -> None:
    print(text, flush=True)


# --- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty sequence (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))
