"""What comes next, in one query: the scheduler's look ahead before it works or sleeps.

An idle scheduler reads this and goes back to sleep: nothing is planned, claimed or swept
unless the horizon says something is due, so idling costs one statement per wake-up.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.db import connections
from django.db.models import Min

from django_periodic import clock
from django_periodic.models import Lease, Run, Schedule


@dataclass(frozen=True)
class Horizon:
    now: datetime  # the database's clock
    next_fire: datetime | None  # earliest cursor of an enabled schedule
    next_retry: datetime | None  # earliest retry of a run waiting to retry
    next_expiry: datetime | None  # earliest expiry of a lease still held, by any process
    next_pending: datetime | None  # earliest plan time of a run waiting to be claimed

    def claimable(self) -> bool:
        """A run may be claimed to start now."""
        retry_due = self.next_retry is not None and self.next_retry <= self.now
        return _reached(self.next_pending, self.now) or retry_due

    def claimable_ahead(self, ahead: timedelta) -> bool:
        """A pending run is due within ``ahead``: it may be claimed to start on time."""
        return _reached(self.next_pending, self.now + ahead)

    def fire_due(self, ahead: timedelta = timedelta(0)) -> bool:
        """A schedule fires within ``ahead`` (now, by default)."""
        return _reached(self.next_fire, self.now + ahead)

    def lease_expired(self) -> bool:
        return self.next_expiry is not None and self.next_expiry < self.now


def _reached(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


HORIZON_SQL = """
SELECT statement_timestamp(),
    (SELECT MIN(next_fire_at) FROM {schedule} WHERE enabled),
    (SELECT MIN(next_retry_at) FROM {run} WHERE status = 'retrying'),
    (SELECT MIN(expires_at) FROM {lease} WHERE released_at IS NULL),
    (SELECT MIN(plan_time) FROM {run} WHERE status = 'pending')
"""


@cache
def _horizon_sql(using: str) -> str:
    quote = connections[using].ops.quote_name
    return HORIZON_SQL.format(
        schedule=quote(Schedule._meta.db_table),
        run=quote(Run._meta.db_table),
        lease=quote(Lease._meta.db_table),
    )


def look_ahead(using: str = "default") -> Horizon:
    """The horizon now: one statement on PostgreSQL, a few through the ORM elsewhere."""
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(_horizon_sql(using))
            row = cursor.fetchone()
        assert row is not None
        return Horizon(*row)
    runs = Run.objects.using(using)
    return Horizon(
        now=clock.now(using),
        next_fire=Schedule.objects.using(using).enabled().aggregate(at=Min("next_fire_at"))["at"],
        next_retry=runs.filter(status=Run.Status.RETRYING).aggregate(at=Min("next_retry_at"))["at"],
        next_expiry=Lease.objects.using(using).held().aggregate(at=Min("expires_at"))["at"],
        next_pending=runs.filter(status=Run.Status.PENDING).aggregate(at=Min("plan_time"))["at"],
    )
