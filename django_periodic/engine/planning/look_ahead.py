"""What comes next, in one query: the scheduler's look ahead before it works or sleeps.

An idle scheduler reads this and goes back to sleep: nothing is planned, claimed or swept
unless the horizon says something is due, so idling costs one statement per wake-up.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Expression, F, QuerySet

from django_periodic.engine.backends import ledger
from django_periodic.models import CLAIMABLE_STATUSES, RELEASE, Lease, Run, Schedule


@dataclass(frozen=True)
class Horizon:
    now: datetime  # the database's clock
    next_fire: datetime | None  # earliest cursor of an enabled schedule
    next_retry: datetime | None  # earliest retry of a run waiting to retry (not enqueued)
    next_expiry: datetime | None  # earliest expiry of a lease still held, by any process
    next_pending: datetime | None  # earliest release of a run our workers may claim
    next_handoff: datetime | None  # earliest release of a handed-off run not enqueued
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


def earliest(using: str, jobs: tuple[str, ...]) -> dict[str, tuple[QuerySet[Any], Expression | F]]:
    """Each time of the horizon: the rows it is the earliest of, and of which column (or
    expression). One home for both paths: the ORM reads these, the statement is built
    from them. Runs our workers execute count only if their job is one of ``jobs``, this
    process's (fleet.py): a run only another release can execute is no work for us."""
    runs = Run.objects.using(using)
    ours = runs.executed_here().of_jobs(jobs)
    pending = ours.filter(status=Run.Status.PENDING)
    retries = (ours | runs.handed_off()).filter(status=Run.Status.RETRYING)
    enqueued = runs.filter(status__in=CLAIMABLE_STATUSES, enqueued_at__isnull=False)
    return {
        "next_fire": (Schedule.objects.using(using).enabled(), F("next_fire_at")),
        "next_retry": (retries.filter(enqueued_at__isnull=True), F("next_retry_at")),
        "next_expiry": (Lease.objects.using(using).held(), F("expires_at")),
        "next_pending": (pending, RELEASE),
        "next_handoff": (
            runs.handed_off().filter(status=Run.Status.PENDING, enqueued_at__isnull=True),
            RELEASE,
        ),
        # As periodic_run_enqueued indexes them: their first entry is the earliest.
        "next_enqueued": (enqueued, F("enqueued_at")),
    }


def look_ahead(using: str = "default", *, judge: bool = False) -> Horizon:
    """The horizon now: one statement on PostgreSQL, a few through the ORM elsewhere.

    With ``judge``, it also tells whether a lease is held by a process that died
    (``presence.py``): only a process that may judge asks.
    """
    return ledger(using).look_ahead(using, judge)
