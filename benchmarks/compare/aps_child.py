"""The APScheduler 3 peer: a BackgroundScheduler with its SQLAlchemyJobStore on the
benchmark's PostgreSQL ($BENCH_SQLALCHEMY_URL), default executor (10 threads) and defaults.

    python aps_child.py   # until SIGTERM (events: $BENCH_EVENTS)

Events come from APScheduler's own listeners: ``submit`` per job handed to the executor
(APScheduler dispatches these after each pass over the due jobs), ``run`` per job executed
``missed`` per run time dropped and ``error`` per job that raised, each with the scheduled
run time.
"""

import os
import signal
import threading
from datetime import UTC

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
)
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from peer_events import EVENTS


def on_submitted(event) -> None:
    for run_time in event.scheduled_run_times:
        EVENTS.now("submit", run_time.timestamp())


def on_executed(event) -> None:
    EVENTS.now("run", event.scheduled_run_time.timestamp())


def on_missed(event) -> None:
    EVENTS.now("missed", event.scheduled_run_time.timestamp())


def on_error(event) -> None:
    EVENTS.now("error", event.scheduled_run_time.timestamp())
    print(f"job {event.job_id} raised: {event.exception!r}", flush=True)


def main() -> None:
    store = SQLAlchemyJobStore(url=os.environ["BENCH_SQLALCHEMY_URL"])
    scheduler = BackgroundScheduler(jobstores={"default": store}, timezone=UTC)
    scheduler.add_listener(on_submitted, EVENT_JOB_SUBMITTED)
    scheduler.add_listener(on_executed, EVENT_JOB_EXECUTED)
    scheduler.add_listener(on_missed, EVENT_JOB_MISSED)
    scheduler.add_listener(on_error, EVENT_JOB_ERROR)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    scheduler.start()
    EVENTS.now("ready")
    stop.wait()
    scheduler.shutdown(wait=False)


if __name__ == "__main__":
    main()
