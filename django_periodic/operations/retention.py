"""Retention: deleting the finished runs that no rule keeps, in bounded batches, one process
at a time.

The rules, and how a pass finds the runs they let go without reading every schedule, are in
``prunable.py``. A schedule's versions (docs/versions.md), and a concurrency limit's, are
kept by count: its newest ``KEEP_VERSIONS``. They are trimmed as each new one is written
(``versions.trim_versions()``), so the background pass has none to delete; ``prune_runs``
alone walks them (``prune(versions=True)``), for versions past a lowered ``KEEP_VERSIONS``
or written around ``save()``.

``run_scheduler`` applies the rules in a background pass (``pruner.py``) and ``prune_runs``
applies them from cron; both delete through ``prune()``.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery, signals

from django_periodic.conf import get_settings
from django_periodic.db import features, pooling, postgresql
from django_periodic.models import (
    Lease,
    LimitVersion,
    Run,
    RunQuerySet,
    Schedule,
    ScheduleVersion,
)
from django_periodic.models.versions import older_versions
from django_periodic.operations import prunable
from django_periodic.operations.prunable import SCHEDULE_BATCH, Mark, Rules


@dataclass
class Pruned:
    """What a prune deleted (or, dry, would delete)."""

    runs: int = 0
    leases: int = 0
    busy: bool = False  # another process was pruning: nothing was done
    versions: int = 0

    def __add__(self, other: "Pruned") -> "Pruned":
        return Pruned(
            self.runs + other.runs,
            self.leases + other.leases,
            self.busy or other.busy,
            self.versions + other.versions,
        )


def prune(
    now: datetime,
    *,
    using: str = "default",
    rules: Rules | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
    wait: bool = False,
    stopping: Callable[[], bool] = lambda: False,
    versions: bool = False,
    since: Mark | None = None,
) -> Iterator[Pruned]:
    """Delete the finished runs (and their leases) that no rule keeps, then, with
    ``versions``, the versions past each schedule's newest ``KEEP_VERSIONS``, yielding what
    each batch deleted; ``dry_run`` counts them instead, one count per batch of schedules.

    The schedules with a count rule are all walked, or with ``since``, only those whose runs
    changed since that mark (``prunable.by_count``).

    Versions are trimmed as they are written: only ``prune_runs`` asks for ``versions``,
    which reads every schedule's newest versions, a batch of schedules per statement.

    One process prunes at a time (an advisory lock on PostgreSQL): without ``wait``, a
    prune that finds another under way yields ``Pruned(busy=True)`` and stops. ``stopping``
    is asked between batches. Each batch is its own short transaction.
    """
    rules = rules or Rules.from_settings()
    batch_size = batch_size or get_settings().PRUNE_BATCH_SIZE
    with _one_at_a_time(using, wait) as alone:
        if not alone:
            yield Pruned(busy=True)
            return
        for runs in _prunables(now, rules, using, since):
            if dry_run:
                yield _count(runs)
                continue
            for deleted in delete_in_batches(runs, batch_size, using):
                yield deleted
                if stopping():
                    return
            if stopping():
                return
        keep_versions = get_settings().KEEP_VERSIONS
        if versions and keep_versions is not None:
            for gone in prune_versions(keep_versions, using=using, dry_run=dry_run):
                yield Pruned(versions=gone)
                if stopping():
                    return


def pending(
    now: datetime, *, using: str = "default", rules: Rules | None = None, since: Mark | None = None
) -> bool:
    """Whether ``prune()`` would delete any run now: its reads, without the lock, up to the
    first run found. With nothing to delete and ``since`` given, a few statements
    (``prunable``), none of which reads every schedule."""
    runs = _prunables(now, rules or Rules.from_settings(), using, since)
    return any(found.exists() for found in runs)


def _prunables(
    now: datetime, rules: Rules, using: str, since: Mark | None
) -> Iterator[RunQuerySet]:
    """The finished runs that no rule keeps: those of the groups kept by age alone in one
    set, whatever their number; then those of the schedules with a count rule, a batch of
    schedules at a time."""
    found = prunable.groups(rules, using)
    by_age = prunable.by_age(now, found, using)
    if by_age is not None:
        yield by_age
    for by_schedule in prunable.by_count(now, found, using, since):
        yield prunable.of_schedules(by_schedule, using)


def prune_versions(keep: int, *, using: str = "default", dry_run: bool = False) -> Iterator[int]:
    """Delete each schedule's versions but its newest ``keep`` (by id: the order they were
    recorded in), yielding how many each batch of schedules lost (``dry_run``: would lose);
    then each concurrency limit's likewise.

    Each new version trims its schedule's (``versions.trim()``); this catches up with the
    versions past a lowered ``KEEP_VERSIONS``, or written without ``save()``. It walks every
    schedule, so only ``prune_runs`` runs it, never ``run_scheduler``'s periodic pass.

    One statement finds a batch's cutoffs, each a short read of the schedule's newest
    versions; one more deletes (or counts) the older ones of the whole batch.
    """
    newest = ScheduleVersion.objects.filter(schedule=OuterRef("pk")).order_by("-pk").values("pk")
    schedules = Schedule.objects.using(using).order_by("pk")
    after = 0
    while True:
        batch = schedules.filter(pk__gt=after).annotate(nth=Subquery(newest[keep - 1 : keep]))
        rows = list(batch.values_list("pk", "nth")[:SCHEDULE_BATCH])
        condition = Q()
        for pk, nth in rows:
            if nth is not None:
                condition |= Q(schedule_id=pk, pk__lt=nth)
        if condition:
            old = ScheduleVersion.objects.using(using).filter(condition)
            yield old.count() if dry_run else _delete(old)
        if len(rows) < SCHEDULE_BATCH:
            break
        after = rows[-1][0]
    # The limits' too: few (a limit is a row a person adds), so all of them in one statement.
    old = older_versions(LimitVersion, "limit_id", keep, using)
    yield old.count() if dry_run else _delete(old)


def _count(runs: RunQuerySet) -> Pruned:
    leases = Lease.objects.using(runs.db).filter(run__in=runs.values("pk"))
    return Pruned(runs.count(), leases.count())


@contextmanager
def _one_at_a_time(using: str, wait: bool) -> Iterator[bool]:
    """Hold the pruning lock (PostgreSQL: a session advisory lock, freed with the session if
    the process dies); yield whether this process got it. SQLite writes one at a time.
    Through a transaction pooler no session lasts to hold it: prunes may overlap, which
    deletes nothing twice (finished runs never change)."""
    if not features(using).has_sessions or pooling.transaction_pooled(using):
        yield True
        return
    with postgresql.one_at_a_time(connections[using], postgresql.PRUNING, wait) as got:
        yield got


def delete_in_batches(runs: RunQuerySet, batch_size: int, using: str) -> Iterator[Pruned]:
    """Delete ``runs`` batch by batch, yielding what each batch deleted.

    Each batch is its own short transaction of three statements (select ids, delete their
    leases, delete them), so locks are held briefly and a long prune can be interrupted
    without losing what was done. Batches walk the primary key upwards, so no batch
    rescans rows (or the dead index entries) of the ones before.
    """
    # SQLite binds at most 999 parameters per statement in older builds.
    limit = connections[using].features.max_query_params or batch_size
    batch_size = min(batch_size, limit)
    after = 0
    while True:
        with transaction.atomic(using=using):
            pks = list(
                runs.filter(pk__gt=after).order_by("pk").values_list("pk", flat=True)[:batch_size]
            )
            deleted = _delete_batch(pks, using) if pks else Pruned()
        if pks:
            yield deleted
        if len(pks) < batch_size:
            return
        after = pks[-1]


def _delete_batch(pks: list[int], using: str) -> Pruned:
    """Delete these runs and their leases.

    Leases go first, by run id, so the runs have nothing left to cascade to and can be
    deleted by primary key. Finished runs never change status again and get no new
    lease, so the ids selected stay safe to delete.
    """
    leases = _delete(Lease.objects.using(using).filter(run_id__in=pks))
    runs = _delete(Run.objects.using(using).filter(pk__in=pks))
    return Pruned(runs, leases)


def _delete(rows: QuerySet[Any]) -> int:
    """Delete ``rows`` in one statement and return how many went.

    ``QuerySet.delete()`` would first fetch every full run row to collect the lease
    cascade. It is kept only when project code hooks into deleting these rows (a delete
    signal, or its own model pointing at them), since that needs the rows.
    """
    model = rows.model
    hooked = (
        any(relation.related_model is not Lease for relation in model._meta.related_objects)
        or signals.pre_delete.has_listeners(model)
        or signals.post_delete.has_listeners(model)
    )
    if hooked:
        return rows.delete()[1].get(model._meta.label, 0)
    return rows._raw_delete(rows.db)
