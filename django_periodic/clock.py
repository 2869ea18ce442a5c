"""The one clock: the database's. Plan times, leases and retries are all read from it,
so scheduler processes on machines with skewed clocks still agree."""

from datetime import UTC, datetime

from django.db import connections
from django.utils import timezone


def wall_now() -> datetime:
    """This machine's clock, for defaults that need no agreement between processes."""
    return timezone.now()


def now(using: str = "default") -> datetime:
    """The database's current time, aware UTC.

    SQLite runs inside this process, so its clock is this machine's clock.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return wall_now()
    value: datetime
    with connection.cursor() as cursor:
        # statement_timestamp(), unlike now(), advances inside a long transaction.
        cursor.execute("SELECT statement_timestamp()")
        (value,) = cursor.fetchone()
    return value.astimezone(UTC)
