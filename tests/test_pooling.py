"""Through PgBouncer in transaction mode: what needs a session goes to the direct connection
(WAKEUP_DATABASE) or is done without one, and a listener that gets no notification is
never trusted (db/pooling.py, wakeups.Listener._probe).

The tests that need PgBouncer run in the PgBouncer run of scripts/test.sh, where "default"
goes through it and "direct" does not; elsewhere they skip.
"""

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection

from django_periodic.checks import pooling_warnings, wakeup_database_errors
from django_periodic.db import announcements, pooling, postgresql, prepared
from django_periodic.engine.loop import wakeups
from django_periodic.engine.runs import presence
from django_periodic.models import Run, SchedulerProcess
from django_periodic.operations import prunable, retention
from tests.factories import RunFactory, ScheduleFactory
from tests.processes import wait_for, wait_for_children_to_disconnect

pytestmark = pytest.mark.pgbouncer

WAKE_TIMEOUT = 10  # seconds; a wake-up normally takes milliseconds
POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "app"}
# The listener connects to "direct" from its thread.
BOTH_ALIASES = pytest.mark.django_db(transaction=True, databases="__all__")
POOLED = {**POSTGRES, "PORT": 6432, "DISABLE_SERVER_SIDE_CURSORS": True}


class Locks:
    """A ``take_lock`` for a listener that takes the real session lock and says when."""

    def __init__(self, process: SchedulerProcess) -> None:
        self.process = process
        self.taken = threading.Event()

    def __call__(self, raw_connection) -> bool:
        held = presence.take(raw_connection, self.process)
        self.taken.set()
        return held


def lost_processes() -> list[int]:
    """The processes a sweeper would judge dead now (presence.LOST_SQL, on "default")."""
    with connection.cursor() as cursor:
        cursor.execute(presence.lost_sql(connection.ops.quote_name))
        return [pk for (pk,) in cursor.fetchall()]


@pytest.fixture
def started(transactional_db):
    """Start a listener with ``started(process)``; it is stopped and its sessions end after."""
    listeners: list[wakeups.Listener] = []

    def start(process: SchedulerProcess) -> tuple[wakeups.Listener, threading.Event, Locks]:
        wake, locks = threading.Event(), Locks(process)
        listener = wakeups.Listener("default", wake)
        listeners.append(listener)
        assert listener.start(locks)
        return listener, wake, locks

    yield start
    for listener in listeners:
        listener.stop()
    wait_for_children_to_disconnect()


@BOTH_ALIASES
def test_wakeups_through_pgbouncer_reach_the_listener_on_the_direct_connection(
    pgbouncer, started, process
):
    listener, wake, _locks = started(process)
    wait_for(lambda: listener.listening, WAKE_TIMEOUT, "the listener to trust its connection")
    assert listener.alias == "direct"
    wake.clear()
    announcements.notify("default")  # through PgBouncer, as the schedulers and the admin send them
    assert wake.wait(WAKE_TIMEOUT), "a notification sent through PgBouncer never arrived"


@BOTH_ALIASES
def test_the_session_lock_held_on_the_direct_connection_is_seen_through_pgbouncer(
    pgbouncer, started, process
):
    listener, _wake, _locks = started(process)
    wait_for(lambda: listener.may_judge(), WAKE_TIMEOUT, "the listener to hold its lock")
    process.refresh_from_db()
    assert process.locked_at is not None
    assert lost_processes() == []  # the sweeper, through PgBouncer, sees the lock
    listener.stop()  # its session ends, as a SIGKILL would end it
    wait_for(lambda: lost_processes() == [process.pk], WAKE_TIMEOUT, "the lock to be lost")


@BOTH_ALIASES
def test_a_listener_through_pgbouncer_is_not_trusted_and_takes_no_lock(
    pgbouncer, settings, started, process, monkeypatch, caplog
):
    # The mistake the probe exists for: LISTEN through the pooler succeeds, and would
    # deliver nothing; a session lock there would outlive the process on a pooled server
    # connection, or vanish while it lives.
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "WAKEUP_DATABASE": "default"}
    monkeypatch.setattr(wakeups, "PROBE_TIMEOUT", 1.0)
    caplog.set_level(logging.WARNING, logger="django_periodic")
    listener, _wake, locks = started(process)
    wait_for(
        lambda: "did not reach the listener" in caplog.text,
        WAKE_TIMEOUT,
        "the listener to give up on its connection",
    )
    assert not listener.listening
    assert not locks.taken.is_set()
    process.refresh_from_db()
    assert process.locked_at is None


def test_without_a_wakeup_database_a_pooled_alias_gets_no_listener(pgbouncer, settings):
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "WAKEUP_DATABASE": None}
    listener = wakeups.Listener("default", threading.Event())
    assert not listener.start()  # the loop polls, and leases expire


def test_a_lock_taken_on_another_database_is_released_and_not_noted(postgres, process):
    stranger = SchedulerProcess(pk=process.pk + 1000, host=process.host, pid=process.pid)
    connection.ensure_connection()
    raw = connection.connection
    assert not presence.take(raw, stranger)  # no such row where this connection goes
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND objid = %s AND pid = pg_backend_pid()",
            [postgresql.LOCK_NAMESPACE, stranger.pk],
        )
        assert cursor.fetchone()[0] == 0


def test_our_statements_are_not_prepared_through_pgbouncer_and_are_on_the_direct_alias(
    pgbouncer,
):
    assert not pooling.prepares("default")  # PgBouncer 1.18 would lose them
    assert pooling.prepares("direct")
    with prepared.cursor("default") as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_pruning_through_pgbouncer_takes_no_session_lock_and_deletes(pgbouncer, now):
    schedule = ScheduleFactory()
    old = [
        RunFactory(
            schedule=schedule,
            plan_time=now - timedelta(days=age),
            finished_at=now,
            status=Run.Status.SUCCEEDED,
        )
        for age in (3, 2)
    ]
    deleted = sum(batch.runs for batch in retention.prune(now, rules=prunable.Rules(keep_runs=1)))
    assert deleted == 1
    assert list(Run.objects.values_list("pk", flat=True)) == [old[1].pk]


# -- the system checks (settings only) ---------------------------------------------------------


def test_a_pooled_default_without_a_wakeup_database_is_warned_about():
    warnings = pooling_warnings(None, {"default": POOLED})
    assert [w.id for w in warnings] == ["django_periodic.W004"]
    assert pooling_warnings(None, {"default": POSTGRES}) == []
    assert pooling_warnings("direct", {"default": POOLED, "direct": POSTGRES}) == []


@pytest.mark.parametrize(
    ("databases", "expected"),
    [
        ({"default": POOLED}, "names no alias of DATABASES (default)"),
        (
            {"default": POOLED, "direct": {"ENGINE": "django.db.backends.sqlite3"}},
            "must be a PostgreSQL database",
        ),
        ({"default": POOLED, "direct": POOLED}, "where LISTEN cannot work"),
    ],
)
def test_a_wakeup_database_that_cannot_listen_is_an_error(databases, expected):
    errors = wakeup_database_errors("direct", databases)
    assert [e.id for e in errors] == ["django_periodic.E009"]
    assert expected in errors[0].msg
