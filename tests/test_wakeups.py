"""Wake-ups: NOTIFY at commit on PostgreSQL, a listener thread that survives its connection."""

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_periodic.db import announcements, clock, postgresql
from django_periodic.engine.loop import wakeups
from django_periodic.engine.loop.scheduler import Scheduler
from django_periodic.models import Run
from tests.factories import ScheduleFactory
from tests.helpers import set_cursor
from tests.processes import wait_for, wait_for_children_to_disconnect

WAKE_TIMEOUT = 10  # seconds; a wake-up normally takes milliseconds


def listening_backends() -> list[int]:
    """The pids of the other sessions whose last statement was LISTEN (a listener's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %%'"
        )
        return [pid for (pid,) in cursor.fetchall()]


def notify_elsewhere(payload: str) -> None:
    """Send a marked notification, committed at once, from a session of its own."""
    wrapper = connections.create_connection("default")
    try:
        wrapper.ensure_connection()
        wrapper.connection.autocommit = True
        wrapper.connection.execute("SELECT pg_notify(%s, %s)", [postgresql.CHANNEL, payload])
    finally:
        wrapper.close()


def payloads(raw, count: int) -> list[str]:
    """The payloads of the next ``count`` notifications, in the order they were committed."""
    delivered = raw.notifies(timeout=WAKE_TIMEOUT, stop_after=count)
    return [notify.payload for notify in delivered]


@pytest.fixture
def wake():
    return threading.Event()


@pytest.fixture
def listener(postgres, transactional_db, wake):
    """A started listener; after the test it is stopped and its session has ended."""
    listener = wakeups.Listener("default", wake)
    assert listener.start()
    yield listener
    listener.stop()
    wait_for_children_to_disconnect()


def connected(wake: threading.Event) -> None:
    """Wait for the listener's first wake-up (it listens from then on), and consume it."""
    assert wake.wait(WAKE_TIMEOUT), "the listener never connected"
    wake.clear()


@pytest.fixture
def raw_listen(postgres, transactional_db):
    """A psycopg connection of our own, LISTENing on the wake-up channel."""
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    raw = wrapper.connection
    raw.autocommit = True
    raw.execute(f"LISTEN {postgresql.CHANNEL}")
    yield raw
    wrapper.close()
    wait_for_children_to_disconnect()


def test_notify_does_nothing_on_sqlite(sqlite):
    with CaptureQueriesContext(connection) as captured:
        announcements.notify()
    assert len(captured) == 0


def test_a_listener_is_not_supported_on_sqlite(sqlite, wake):
    listener = wakeups.Listener("default", wake)
    assert not wakeups.Listener.supported("default")
    assert listener.start() is False
    assert not wake.is_set()


def test_a_listener_wakes_its_loop_as_soon_as_it_listens(listener, wake):
    assert wake.wait(WAKE_TIMEOUT)
    assert len(listening_backends()) == 1


def test_notify_wakes_a_listener(listener, wake):
    connected(wake)
    announcements.notify()
    assert wake.wait(WAKE_TIMEOUT)


def test_a_notify_inside_a_transaction_is_delivered_at_its_commit(raw_listen):
    with transaction.atomic():
        announcements.notify()
        notify_elsewhere("committed meanwhile")
        assert payloads(raw_listen, 1) == ["committed meanwhile"]
    assert payloads(raw_listen, 1) == [""]


def test_a_notify_rolled_back_is_never_delivered(raw_listen):
    with transaction.atomic():
        announcements.notify()
        transaction.set_rollback(True)
    notify_elsewhere("after the rollback")
    assert payloads(raw_listen, 1) == ["after the rollback"]


def test_a_listener_reconnects_after_its_backend_is_terminated(listener, wake):
    connected(wake)
    (backend,) = listening_backends()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    assert wake.wait(WAKE_TIMEOUT), "no wake-up when the connection dropped"
    wake.clear()
    assert wake.wait(WAKE_TIMEOUT + wakeups.MAX_RECONNECT_DELAY), "no wake-up on reconnect"
    wake.clear()
    others = wait_for(
        lambda: [pid for pid in listening_backends() if pid != backend],
        WAKE_TIMEOUT,
        "a new listening session",
    )
    assert len(others) == 1
    announcements.notify()
    assert wake.wait(WAKE_TIMEOUT)


def test_a_stopped_listener_closes_its_connection(listener, wake):
    connected(wake)
    listener.stop()
    wait_for(lambda: not listening_backends(), WAKE_TIMEOUT, "the listener's session to end")


def test_runs_planned_beyond_what_the_planner_starts_itself_wake_the_other_schedulers(raw_listen):
    """A plan-only scheduler starts none of the runs it plans: the others, asleep until
    their next fire or poll, are woken to claim them now."""
    scheduler = Scheduler(workers=0)
    scheduler.boot()
    try:
        schedule = ScheduleFactory()
        set_cursor(schedule, clock.now())
        notify_elsewhere("before the tick")  # the notifications sent so far come before it
        assert "before the tick" in (n.payload for n in raw_listen.notifies(timeout=WAKE_TIMEOUT))
        scheduler.tick()
        assert Run.objects.filter(schedule=schedule).exists()
        assert payloads(raw_listen, 1) == [""]
    finally:
        scheduler.stop.request()
        scheduler.shutdown()
