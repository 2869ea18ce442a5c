"""What comes next, in one query: the scheduler's look ahead before it works or sleeps.

An idle scheduler reads this and goes back to sleep: nothing is planned, claimed or swept
unless the horizon says something is due, so idling costs one statement per wake-up.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.db import connections
from django.db.models import Min

from django_periodic import clock, presence
from django_periodic.bounds import EARLIEST, LATEST
from django_periodic.models import Lease, Run, Schedule


@dataclass(frozen=True)
class Horizon:
    now: datetime  # the database's clock
    next_fire: datetime | None  # earliest cursor of an enabled schedule
    next_retry: datetime | None  # earliest retry of a run waiting to retry (not enqueued)
    next_expiry: datetime | None  # earliest expiry of a lease still held, by any process
    next_pending: datetime | None  # earliest plan time of a run our workers may claim
    next_handoff: datetime | None  # earliest plan time of a handed-off run not enqueued
    next_enqueued: datetime | None  # earliest enqueue of a handed-off run still waiting
    # A lease is held by a process that lost its session lock: it died (presence.py).
    orphaned: bool = False

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

    def handoff_due(self, pickup_timeout: timedelta) -> bool:
        """A handed-off run may start (or be retried) and has no task yet, or its task has
        waited past ``pickup_timeout`` (presumed lost): dispatch."""
        enqueued = self.next_enqueued
        redeliver = None if enqueued is None else enqueued + pickup_timeout
        due = (self.next_handoff, self.next_retry, redeliver)
        return any(_reached(at, self.now) for at in due)

    def lease_expired(self) -> bool:
        """A lease expired, or its holder died: sweep."""
        expired = self.next_expiry is not None and self.next_expiry < self.now
        return expired or self.orphaned


def _reached(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


# Each MIN reads the first entry of a partial index (see Run.Meta.indexes), once (the CTE
# is MATERIALIZED: inlined, every use of a MIN would read it again). Each is held
# within the range of stored times: a row stored past the database's checks with a time
# Python cannot hold (year 20000, say) must not make every look ahead fail; the rows
# themselves fail where they are handled.
HORIZON_SQL = """
WITH m AS MATERIALIZED (SELECT
    (SELECT MIN(next_fire_at) FROM {schedule} WHERE enabled) AS next_fire,
    (SELECT MIN(next_retry_at) FROM {run} WHERE status = 'retrying' AND enqueued_at IS NULL)
    AS next_retry,
    (SELECT MIN(expires_at) FROM {lease} WHERE released_at IS NULL) AS next_expiry,
    (SELECT MIN(plan_time) FROM {run} WHERE status = 'pending' AND tasks_backend = '')
    AS next_pending,
    (SELECT MIN(plan_time) FROM {run}
     WHERE status = 'pending' AND tasks_backend <> '' AND enqueued_at IS NULL) AS next_handoff,
    (SELECT MIN(enqueued_at) FROM {run}
     WHERE status IN ('pending', 'retrying') AND enqueued_at IS NOT NULL) AS next_enqueued
)
SELECT statement_timestamp(), {next_fire}, {next_retry}, {next_expiry}, {next_pending},
    {next_handoff}, {next_enqueued},
    %(judge)s AND EXISTS (
        SELECT 1 FROM {lease} WHERE released_at IS NULL AND process_id IN ({lost})
    )
FROM m
"""
# A time held within [EARLIEST, LATEST]; NULL stays NULL (which LEAST and GREATEST skip).
WITHIN_BOUNDS = (
    "CASE WHEN m.{0} < %(earliest)s THEN %(earliest)s"
    " WHEN m.{0} > %(latest)s THEN %(latest)s ELSE m.{0} END"
)
TIMES = ("next_fire", "next_retry", "next_expiry", "next_pending", "next_handoff", "next_enqueued")


@cache
def _horizon_sql(using: str) -> str:
    quote = connections[using].ops.quote_name
    return HORIZON_SQL.format(
        schedule=quote(Schedule._meta.db_table),
        run=quote(Run._meta.db_table),
        lease=quote(Lease._meta.db_table),
        lost=presence.lost_sql(quote),
        **{name: WITHIN_BOUNDS.format(name) for name in TIMES},
    )


def look_ahead(using: str = "default", *, judge: bool = False) -> Horizon:
    """The horizon now: one statement on PostgreSQL, a few through the ORM elsewhere.

    With ``judge``, it also tells whether a lease is held by a process that died
    (``presence.py``): only a process that may judge asks.
    """
    if connections[using].vendor == "postgresql":
        params: dict[str, datetime | bool] = {
            "earliest": EARLIEST,
            "latest": LATEST,
            "judge": judge,
        }
        with connections[using].cursor() as cursor:
            cursor.execute(_horizon_sql(using), params)
            row = cursor.fetchone()
        assert row is not None
        return Horizon(*row)
    runs = Run.objects.using(using)
    pending = runs.filter(status=Run.Status.PENDING)
    handed_off = pending.handed_off().filter(enqueued_at__isnull=True)
    retrying = runs.filter(status=Run.Status.RETRYING, enqueued_at__isnull=True)
    return Horizon(
        now=clock.now(using),
        next_fire=Schedule.objects.using(using).enabled().aggregate(at=Min("next_fire_at"))["at"],
        next_retry=retrying.aggregate(at=Min("next_retry_at"))["at"],
        next_expiry=Lease.objects.using(using).held().aggregate(at=Min("expires_at"))["at"],
        next_pending=pending.executed_here().aggregate(at=Min("plan_time"))["at"],
        next_handoff=handed_off.aggregate(at=Min("plan_time"))["at"],
        next_enqueued=runs.waiting()
        .filter(enqueued_at__isnull=False)
        .aggregate(at=Min("enqueued_at"))["at"],
    )
