"""The writing job's limit: its INSERT with no scheduler, on THREADS connections at once.

    python limit_child.py throughput ROWS THREADS [AT]            # ROWS split over the threads
    python limit_child.py burst PER_SECOND SECONDS THREADS [AT]   # PER_SECOND at each second
    python limit_child.py due ROWS THREADS [AT]                   # ROWS queued, threads drain

tests.settings, CONN_MAX_AGE 0, as floor_child.py (see workloads.run_limit). Each row is
written as ``tests.jobs.record`` writes it (``Execution.objects.create``, autocommit); with
BENCH_LIMIT_ATOMIC=1, the atomic writing job's own limit: each row and one UPDATE of a run
row in one transaction (``BENCH_LIMIT_PROCESS`` INDEX/COUNT picks the process's runs). Each
thread has its own connection (Django gives every thread its own), opened before the start
and closed at the end. AT (Unix seconds, a whole second) is when the work starts, so that
several of these processes start together; by default the next whole second + 1.

Prints JSON: ``started`` and ``finished`` (Unix seconds: the release and the last insert
done), ``seconds`` between them, ``late`` (how long after AT the release came: a process that
was not ready by then) and, for burst, ``lags_ms``: each insert's start minus its second.
"""

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from queue import SimpleQueue

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

from tests.models import Execution  # noqa: E402

PLAN_TIME = datetime.now(UTC)
PID = os.getpid()
READY_TIMEOUT = 120.0  # seconds for every thread to open its connection
# The atomic writing job's own limit: its row and one UPDATE of a run row (as its outcome
# is), in one transaction per row. Each process updates runs of its own (ids = INDEX mod
# COUNT), so that no two transactions wait for the same row.
ATOMIC = os.environ.get("BENCH_LIMIT_ATOMIC") == "1"
INDEX, COUNT = (int(n) for n in os.environ.get("BENCH_LIMIT_PROCESS", "0/1").split("/"))
UPDATE_RUN = "UPDATE django_periodic_run SET finished_at = statement_timestamp() WHERE id = %s"
RUN_IDS: SimpleQueue = SimpleQueue()


def insert() -> float:
    """One row, as the writing job writes it (the atomic one, with its run's UPDATE, in one
    transaction); returns when the statement began."""
    began = time.time()
    if not ATOMIC:
        Execution.objects.create(schedule="limit", plan_time=PLAN_TIME, attempt=1, pid=PID)
        return began
    with transaction.atomic():
        Execution.objects.create(schedule="limit", plan_time=PLAN_TIME, attempt=1, pid=PID)
        run_id = RUN_IDS.get_nowait()
        with connection.cursor() as cursor:
            cursor.execute(UPDATE_RUN, [run_id])
    RUN_IDS.put(run_id)  # last in the queue: no two threads update one run at once
    return began


def load_run_ids(rows: int, threads: int) -> None:
    """The run rows the atomic limit updates: one per insert while there are enough, taken
    again in turn if not (more than ``threads``, so that a run is free when taken)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM django_periodic_run WHERE id %% %s = %s ORDER BY id LIMIT %s",
            [COUNT, INDEX, rows],
        )
        ids = [row[0] for row in cursor.fetchall()]
    connection.close()  # the threads open their own
    if len(ids) <= threads:
        raise RuntimeError(f"the atomic limit needs more than {threads} runs, found {len(ids)}")
    for run_id in ids:
        RUN_IDS.put(run_id)


def drain(tasks: SimpleQueue) -> list[float]:
    """One insert per task (the second it belongs to) until the end mark (None); the start
    lag of each behind its second."""
    lags = []
    while (second := tasks.get()) is not None:
        lags.append(insert() - second)
    return lags


class Worker(threading.Thread):
    """One thread, one connection: opened and warmed before the release, closed at the end."""

    def __init__(self, work: Callable[[], object], ready: threading.Barrier, go: threading.Event):
        super().__init__(daemon=True)
        self.work, self.ready, self.go = work, ready, go
        self.result: object = None
        self.finished = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            insert()  # the connection opened and the statements' path warmed, as the floor does
            self.ready.wait()
            self.go.wait()
            self.result = self.work()
            self.finished = time.time()
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.ready.abort()
        finally:
            connection.close()


def run(works: list[Callable[[], object]], at: float, feed: Callable[[], None]) -> dict:
    """Start a thread per work, release them all at ``at``, then ``feed`` them (burst);
    the release, the last finish and each work's result."""
    ready, go = threading.Barrier(len(works) + 1, timeout=READY_TIMEOUT), threading.Event()
    workers = [Worker(work, ready, go) for work in works]
    for worker in workers:
        worker.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass  # a worker failed: its error is raised below
    else:
        time.sleep(max(0.0, at - time.time()))
        started = time.time()
        go.set()
        feed()
    for worker in workers:
        worker.join()
    if errors := [w.error for w in workers if w.error]:
        raise errors[0]
    finished = max(w.finished for w in workers)
    return {
        "started": started,
        "finished": finished,
        "seconds": finished - started,
        "late": started - at,
        "results": [w.result for w in workers],
    }


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def throughput(rows: int, threads: int, at: float) -> dict:
    """ROWS inserts, each thread its fixed share."""
    works = [lambda share=share: [insert() for _ in range(share)] for share in split(rows, threads)]
    outcome = run(works, at, feed=lambda: None)
    del outcome["results"]
    return outcome


def due(rows: int, threads: int, at: float) -> dict:
    """ROWS inserts queued before the release, drained by the threads as they come free:
    the scheduler's workers taking due runs."""
    tasks: SimpleQueue = SimpleQueue()
    for _ in range(rows):
        tasks.put(at)
    for _ in range(threads):
        tasks.put(None)
    outcome = run([lambda: drain(tasks)] * threads, at, feed=lambda: None)
    del outcome["results"]
    return outcome


def burst(per_second: int, seconds: int, threads: int, at: float) -> dict:
    """At each whole second from ``at``, PER_SECOND inserts queued for the threads: the
    scheduler's fires every second. Each insert's start lag behind its second."""
    tasks: SimpleQueue = SimpleQueue()

    def feed() -> None:
        for second in range(int(at), int(at) + seconds):
            time.sleep(max(0.0, second - time.time()))
            for _ in range(per_second):
                tasks.put(float(second))
        for _ in range(threads):
            tasks.put(None)

    outcome = run([lambda: drain(tasks)] * threads, at, feed)
    outcome["lags_ms"] = [lag * 1000 for lags in outcome.pop("results") for lag in lags]
    return outcome


def main(argv: list[str]) -> dict:
    mode, numbers = argv[0], [int(a) for a in argv[1:]]
    arity = {"throughput": 2, "due": 2, "burst": 3}[mode]
    # By default the next whole second + 1: time for the threads to connect.
    at = float(numbers[arity]) if len(numbers) > arity else float(int(time.time()) + 2)
    if ATOMIC:
        rows = numbers[0] * (numbers[1] if mode == "burst" else 1)
        load_run_ids(rows, numbers[arity - 1])
    return {"throughput": throughput, "due": due, "burst": burst}[mode](*numbers[:arity], at)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
