"""The one clock: the database's, aware UTC."""

from datetime import UTC

from django.db import connection, transaction
from django.utils import timezone

from django_periodic import clock
from tests.processes import wait_for


def scalar(sql: str):
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def test_now_is_aware_utc(db):
    assert clock.now().tzinfo is UTC


def test_wall_now_is_aware_utc():
    assert clock.wall_now().tzinfo is UTC


def test_on_sqlite_now_is_this_machines_clock(sqlite):
    before = timezone.now()
    value = clock.now()
    assert before <= value <= timezone.now()


def test_on_postgresql_now_is_the_statement_timestamp(postgres):
    before = scalar("SELECT statement_timestamp()")
    value = clock.now()
    assert before <= value <= scalar("SELECT statement_timestamp()")


def test_on_postgresql_now_is_utc_whatever_the_session_time_zone(postgres):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TIME ZONE 'America/New_York'")
        before = scalar("SELECT statement_timestamp()")
        value = clock.now()
        assert value.tzinfo is UTC
        assert before <= value <= scalar("SELECT statement_timestamp()")


def test_on_postgresql_now_advances_inside_a_transaction(postgres):
    with transaction.atomic():
        started = scalar("SELECT now()")  # the transaction's start, fixed until it ends
        wait_for(lambda: clock.now() > started, 5, "the database clock to pass the start")
        assert scalar("SELECT now()") == started
