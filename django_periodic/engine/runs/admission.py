"""Admission: held runs of a concurrency limit get their release back while it has free slots.

A run of a limited schedule is recorded held (``models/limits.py``): no claim takes it until
a pass here admits it. One pass, for every limit with runs waiting:

1. lock those limits' rows, in id order (two passes never deadlock; the second waits, then
   counts what the first admitted: each later statement reads after the lock);
2. skip the waiting runs past their start deadline (``ErrorCode.CONCURRENCY_LIMIT``, their
   message naming the limit);
3. count each limit's holders (per scope key for a per-scope limit);
4. admit the oldest waiting runs, by plan time, that may start now into the free slots.

A held run whose limit was deleted is admitted at once. A pass costs a constant number of
statements however many limits and runs; with no run waiting, one statement on an empty
index range.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import (
    Case,
    Count,
    F,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
    Window,
)
from django.db.models.functions import Coalesce, Concat, RowNumber

from django_periodic import signals
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.db import announcements
from django_periodic.engine import overlap
from django_periodic.models import ConcurrencyLimit, Run, RunQuerySet, limits

# While runs wait for a limit, a pass looks again this often (and at once on a wake-up: a
# planning pass, a NOTIFY, such as a limited run's end).
POLL = timedelta(seconds=1)
SKIPPED_MESSAGE = "Its concurrency limit “{}” had no free slot before its start deadline."


@dataclass
class Admission:
    """What a pass did: how many runs it admitted and skipped; whether runs that may start
    still wait for a slot (``full``), and the earliest release of those that may not yet."""

    admitted: int = 0
    skipped: int = 0
    full: bool = False
    next_release: datetime | None = None

    def next_pass(self, now: datetime) -> datetime | None:
        """When to look again without news: soon while a limit is full (a slot may free in
        a way that sends none), at the next release otherwise; None while nothing waits."""
        times = [now + POLL if self.full else None, self.next_release]
        return min((at for at in times if at is not None), default=None)


def admit(now: datetime, using: str = "default") -> Admission:
    """Admit the held runs that their limits have slots for, and skip those past their start
    deadline, in one transaction."""
    with transaction.atomic(using=using):
        waiting = Run.objects.using(using).filter(limits.WAITING)
        # Which limits have runs waiting: one statement on an empty index range, most passes.
        named = set(waiting.order_by().values_list("concurrency_limit", flat=True).distinct())
        if not named:
            return Admission()
        released = 0
        if None in named:  # held by a limit since deleted
            released = waiting.filter(concurrency_limit__isnull=True).update(**_released(now))
        locked = _lock_limits({pk for pk in named if pk is not None}, using)
        if not locked:
            return Admission(admitted=released)
        skipped = _skip_late(waiting.filter(concurrency_limit__in=locked), now, using)
        chosen = _chosen(waiting, locked, now, using)
        admitted = waiting.filter(pk__in=chosen).update(**_released(now)) if chosen else 0
        left = waiting.filter(concurrency_limit__in=locked).alias(release=_RELEASE)
        full = left.filter(_ready(now), release__lte=now).exists()
        later = left.filter(release__gt=now).aggregate(at=Min(_RELEASE))["at"]
    if admitted or released:
        announcements.notify(using)  # claimers everywhere: runs may start
    return Admission(admitted + released, skipped, full, later)


def _released(now: datetime) -> dict[str, Any]:
    """An admitted run's columns: its own release back, kept while it was held, and when."""
    return {"release_at": F("held_release_at"), "held_release_at": None, "admitted_at": now}


# When a held run may start once admitted (run.RELEASE, of the release it keeps).
_RELEASE = Coalesce("held_release_at", "plan_time")


def _ready(now: datetime) -> Q:
    """Held runs not waiting for a retry's time (a backfilled run waits for its own)."""
    return Q(status=RunStatus.PENDING) | Q(next_retry_at__lte=now)


def _lock_limits(ids: set[int], using: str) -> dict[int, ConcurrencyLimit]:
    """These limits, locked (FOR UPDATE) in id order."""
    rows = (
        ConcurrencyLimit.objects.using(using)
        .filter(pk__in=ids)
        .select_for_update()
        .order_by("pk")
        .only("pk", "name", "max_running", "per_scope")
    )
    return {limit.pk: limit for limit in rows}


def _skip_late(late_candidates: RunQuerySet, now: datetime, using: str) -> int:
    """Skip the waiting runs whose start deadline passed (Run.too_late_to_start), naming
    their limit; their signals, and the queued runs of their schedules promoted."""
    late = late_candidates.too_late_to_start(now)
    ended = list(late.values_list("pk", "schedule_id"))
    if not ended:
        return 0
    name = ConcurrencyLimit.objects.filter(pk=OuterRef("concurrency_limit_id")).values("name")
    before, after = SKIPPED_MESSAGE.split("{}")
    Run.objects.using(using).filter(pk__in=[pk for pk, _ in ended]).update(
        status=RunStatus.SKIPPED,
        error_code=ErrorCode.CONCURRENCY_LIMIT,
        error_message=Concat(Value(before), Subquery(name[:1]), Value(after)),
        finished_at=now,
        **limits.unheld(),
    )
    overlap.announce_ended([pk for pk, _ in ended], signals.run_skipped, using)
    overlap.promote_queued(using, {schedule_id for _, schedule_id in ended})
    return len(ended)


def _chosen(
    waiting: RunQuerySet, locked: dict[int, ConcurrencyLimit], now: datetime, using: str
) -> list[int]:
    """The waiting runs to admit: per limit (and scope key, for a per-scope limit), the
    oldest by plan time that may start now, as many as it has free slots."""
    free = _free_slots(locked, using)
    key = Case(When(concurrency_limit__per_scope=True, then=F("scope")), default=Value(""))
    candidates = (
        waiting.filter(_ready(now), concurrency_limit__in=locked)
        .alias(release=_RELEASE)
        .filter(release__lte=now)
        .annotate(
            key=key,
            slots=F("concurrency_limit__max_running"),
            place=Window(
                RowNumber(),
                partition_by=[F("concurrency_limit"), key],
                order_by=["plan_time", "pk"],
            ),
        )
        .filter(place__lte=F("slots"))
        .values_list("pk", "concurrency_limit_id", "key", "place")
    )
    return [
        pk
        for pk, limit, key, place in candidates
        if place <= free.get((limit, key), locked[limit].max_running)
    ]


def _free_slots(locked: dict[int, ConcurrencyLimit], using: str) -> dict[tuple[int, str], int]:
    """Free slots per (limit, scope key) that has holders; a key without any has them all."""
    holders = (
        Run.objects.using(using)
        .filter(limits.HOLDING, concurrency_limit__in=locked)
        .values_list("concurrency_limit_id", "scope")
        .annotate(count=Count("pk"))
        .order_by()
    )
    held: dict[tuple[int, str], int] = defaultdict(int)
    for limit, scope, count in holders:
        held[(limit, scope if locked[limit].per_scope else "")] += count
    return {key: locked[key[0]].max_running - count for key, count in held.items()}
