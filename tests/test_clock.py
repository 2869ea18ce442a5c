"""The one clock: the database's, aware UTC."""

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from django_periodic.db import clock
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


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
OFFSET = 1_000.0  # the database's clock, in seconds, minus this process's monotonic one


def statement(
    match: clock.Match, sent: float, arrives_after: float, answered_after: float, offset=OFFSET
):
    """A statement sent at ``sent`` (monotonic), read by the server ``arrives_after`` later,
    answered ``answered_after`` after that: what the match says of the time it read."""
    read_at = sent + arrives_after
    db_time = EPOCH + timedelta(seconds=read_at + offset)
    return read_at, match.monotonic_of(db_time, read_at + answered_after)


def test_the_match_is_never_early_and_as_tight_as_the_quickest_answer():
    match = clock.Match()
    latencies = [(0.001, 0.020), (0.0002, 0.0003), (0.004, 0.015), (0.002, 0.030)]
    for step, (arrives_after, answered_after) in enumerate(latencies):
        read_at, matched = statement(match, step * 0.1, arrives_after, answered_after)
        assert matched >= read_at  # the time it read comes no earlier than it did
        if step:
            # Slow answers are matched by the quick one before: at most its round trip late.
            assert matched - read_at <= 0.0005 + 1e-9


def test_a_stepped_database_clock_is_followed_once_older_answers_expire():
    match = clock.Match()
    statement(match, 0.0, 0.0001, 0.0001)
    later, stepped = clock.OBSERVATION_LIFETIME + 1, OFFSET - 5  # 5 s back
    read_at, matched = statement(match, later, 0.001, 0.001, offset=stepped)
    assert matched >= read_at
