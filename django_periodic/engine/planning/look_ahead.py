"""What comes next, in one query: the scheduler's look ahead before it works or sleeps.

An idle scheduler reads this and goes back to sleep: nothing is planned, claimed or swept
unless the horizon says something is due, so idling costs one statement per wake-up.
"""

from typing import Any

from django.db.models import Expression, F, QuerySet

from django_periodic.engine.backends import ledger
from django_periodic.engine.records import Horizon
from django_periodic.models import CLAIMABLE_STATUSES, RELEASE, Lease, Run, Schedule


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
