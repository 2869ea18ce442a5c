"""A worker thread keeps its connection from run to run, and replaces one a job left dirty."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_periodic.db import clock
from django_periodic.engine.loop import worker_connections
from django_periodic.models import Run, Schedule
from tests import processes
from tests.factories import ScheduleFactory
from tests.models import Execution
from tests.threads import Thread

pytestmark = pytest.mark.django_db(transaction=True)

on_postgres = pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL backends and sessions"
)


def in_thread(*steps: Callable[[], Any]) -> list[Any]:
    """Run each step on one new thread, as a worker runs jobs, with prepare_for_run() before
    each; return their results. The thread's connections are closed at the end."""
    results: list[Any] = []

    def work() -> None:
        for step in steps:
            worker_connections.prepare_for_run()
            results.append(step())

    thread = Thread(target=work)  # re-raises at join, closes the thread's connections
    thread.start()
    thread.join()
    return results


def session_id() -> Any:
    """What identifies this thread's database session: PostgreSQL's backend pid, else the
    driver connection object's identity."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]
    return id(connection.connection)


def in_transaction() -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT now() = statement_timestamp()")
            # now() is the transaction's start: equal to the statement's outside a transaction.
            return not cursor.fetchone()[0]
    return bool(connection.connection.in_transaction)


def test_a_clean_connection_is_kept_from_run_to_run(monkeypatch):
    # Django's default, which closes a connection at the end of each request (the test
    # settings keep PostgreSQL's for a minute).
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    first, second, third = in_thread(session_id, session_id, session_id)
    assert first == second == third


def leave_atomic_open() -> Any:
    transaction.atomic().__enter__()  # a job that never leaves its atomic block
    return session_id()


def turn_autocommit_off() -> Any:
    transaction.set_autocommit(False)
    return session_id()


def begin_in_raw_sql() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("SELECT 1")
    return session_id()


@pytest.mark.parametrize(
    "dirty", [leave_atomic_open, turn_autocommit_off, begin_in_raw_sql], ids=lambda f: f.__name__
)
def test_a_connection_left_in_a_transaction_is_replaced(dirty):
    dirty_session, next_in_transaction, next_session = in_thread(dirty, in_transaction, session_id)
    assert not next_in_transaction
    if connection.vendor == "postgresql":
        assert next_session != dirty_session


@on_postgres
def test_an_aborted_transaction_is_replaced():
    def abort() -> None:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            with pytest.raises(Exception, match="division by zero"):
                cursor.execute("SELECT 1/0")

    _, next_in_transaction = in_thread(abort, in_transaction)
    assert not next_in_transaction


@on_postgres
def test_a_connection_the_server_closed_is_replaced_before_the_next_run():
    def terminated_by_the_server() -> Any:
        pid = session_id()
        with connections.create_connection("default").cursor() as other:
            # With a timeout, it returns once the backend has gone.
            other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
        return pid

    killed, replacement = in_thread(terminated_by_the_server, session_id)
    assert replacement != killed


def test_prepare_for_run_counts_what_it_replaced():
    def count_after_atomic() -> int:
        transaction.atomic().__enter__()
        return worker_connections.prepare_for_run()

    assert in_thread(count_after_atomic) == [1]


def sessions_started() -> int:
    """Sessions PostgreSQL has started on the test database so far (its statistics)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def sessions_for_runs(children, schedule: Schedule, runs: int) -> int:
    """Sessions a real ``run_scheduler --once`` starts while it executes ``runs`` runs of a job
    that writes a row, under Django's default CONN_MAX_AGE (0)."""
    now = clock.now()
    Run.objects.bulk_create(
        Run.for_schedule(schedule, now - timedelta(microseconds=i), trigger=Run.Trigger.MANUAL)
        for i in range(runs)
    )
    connections.close_all()  # this process's own session is not the child's
    before = sessions_started()
    connections.close_all()
    child = children.start("--once", "--workers", "4", env={"PERIODIC_TEST_CONN_MAX_AGE": "0"})
    assert child.wait(timeout=120) == 0, child.output()
    processes.wait_for_children_to_disconnect()
    connections.close_all()
    started = sessions_started() - before - 1  # less the one that reads the statistics
    assert Run.objects.filter(status=Run.Status.SUCCEEDED).count() == runs
    Run.objects.all().delete()
    return started


@on_postgres
def test_a_scheduler_starts_as_many_sessions_for_a_thousand_runs_as_for_a_hundred(children):
    schedule = ScheduleFactory(job="tests.jobs.record", overlap=Schedule.Overlap.CONCURRENT)
    for_a_hundred = sessions_for_runs(children, schedule, 100)
    for_a_thousand = sessions_for_runs(children, schedule, 1000)
    # Its threads' sessions (main loop, workers, recorder, listener, pruner), not one a run.
    assert for_a_thousand <= for_a_hundred + 2, (for_a_hundred, for_a_thousand)
    assert Execution.objects.count() == 1100
