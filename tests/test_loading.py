from datetime import UTC, datetime

import pytest
from django.db import connection

from django_periodic.db import timestamps

SQL = """
SELECT t, t + interval '1 day' FROM (VALUES
    (timestamptz '2026-01-01 00:00+00'), ('2026-01-01 00:00+00'), ('2026-01-02 00:00+01'), (NULL)
) AS v (t)
"""


def fetch() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(SQL)
        return cursor.fetchall()


def timestamptz_loader():
    from psycopg.pq import Format

    adapters = connection.connection.adapters
    return adapters.get_loader(adapters.types["timestamptz"].oid, Format.TEXT)


@pytest.mark.django_db
def test_timestamps_parsed_once_load_what_django_loads(postgres):
    plain = fetch()
    with timestamps.timestamps_parsed_once("default"):
        once = fetch()
    assert once == plain
    assert once[0][0] == datetime(2026, 1, 1, tzinfo=UTC) and once[0][0].tzinfo is UTC
    assert once[0][0] is once[1][0]  # parsed once, shared by the rows
    assert once[2][0] == datetime(2026, 1, 1, 23, tzinfo=UTC)
    assert once[3] == (None, None)


@pytest.mark.django_db
def test_the_connection_gets_its_own_loader_back(postgres):
    connection.ensure_connection()
    before = timestamptz_loader()
    with pytest.raises(ZeroDivisionError), timestamps.timestamps_parsed_once("default"):
        assert timestamptz_loader() is not before
        raise ZeroDivisionError
    assert timestamptz_loader() is before


@pytest.mark.django_db
def test_timestamps_parsed_once_does_nothing_elsewhere(sqlite):
    with timestamps.timestamps_parsed_once("default"), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
