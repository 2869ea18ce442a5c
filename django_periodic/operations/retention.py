"""Retention: which finished runs are kept, and deleting the others in bounded batches.

A finished run is kept while any rule keeps it: it is one of the last ``keep_runs`` finished
runs of its schedule, or was planned within ``keep_runs_for``, or failed and was planned
within ``keep_failed_runs_for``. Each rule is the schedule's own field, else the setting of
the same name in capitals. A schedule with neither a count nor an age rule keeps everything.

The schedules kept by age alone (no count rule, their own or ``KEEP_RUNS``) share a few
distinct rules: their runs are found in one set, however many schedules there are. Those
with a count rule are read a batch of schedules at a time, each schedule's N-th newest run
read on its history index.

Active runs are never deleted, nor anything planning needs: the schedule's cursor
(``next_fire_at``), not its history, keeps a plan time from firing twice.

A schedule's versions (docs/versions.md) are kept by count: its newest ``KEEP_VERSIONS``.
They are trimmed as each new one is written (``versions.trim()``), so the background pass has
none to delete; ``prune_runs`` alone walks them (``prune(versions=True)``), for versions past
a lowered ``KEEP_VERSIONS`` or written around ``save()``.

``run_scheduler`` applies these rules in a background pass (``pruner.py``) and
``prune_runs`` applies them from cron; both delete through ``prune()``.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    Case,
    DateTimeField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
    signals,
)

from django_periodic.conf import get_settings
from django_periodic.db import features, pooling, postgresql
from django_periodic.models import (
    RETENTION_FIELDS,
    Lease,
    Run,
    RunQuerySet,
    Schedule,
    ScheduleVersion,
)

# Schedules whose cutoffs one statement computes.
SCHEDULE_BATCH = 100


@dataclass(frozen=True)
class Rules:
    """How long finished runs are kept (None: no such rule)."""

    keep_runs: int | None = None
    keep_runs_for: timedelta | None = None
    keep_failed_runs_for: timedelta | None = None

    @classmethod
    def from_settings(cls) -> "Rules":
        """The global rules: the ``KEEP_*`` settings."""
        settings = get_settings()
        return cls(settings.KEEP_RUNS, settings.KEEP_RUNS_FOR, settings.KEEP_FAILED_RUNS_FOR)

    def overridden_by(
        self,
        keep_runs: int | None,
        keep_runs_for: timedelta | None,
        keep_failed_runs_for: timedelta | None,
    ) -> "Rules":
        """These rules with a schedule's own fields (``RETENTION_FIELDS``) where set."""
        return Rules(
            self.keep_runs if keep_runs is None else keep_runs,
            self.keep_runs_for if keep_runs_for is None else keep_runs_for,
            self.keep_failed_runs_for if keep_failed_runs_for is None else keep_failed_runs_for,
        )

    @property
    def limited(self) -> bool:
        """Whether runs may be deleted at all: a count or an age rule is set."""
        return self.keep_runs is not None or self.keep_runs_for is not None


@dataclass(frozen=True)
class Cutoffs:
    """A schedule's finished runs planned before ``before`` may go; failed ones only if
    planned before ``failed_before`` too."""

    before: datetime
    failed_before: datetime


def cutoffs(rules: Rules, now: datetime, nth_newest: datetime | None) -> Cutoffs | None:
    """A schedule's cutoffs under ``rules``; None if it keeps every run.

    ``nth_newest`` is the plan time of its ``keep_runs``-th newest finished run (None if it
    has fewer). Runs planned at that time are kept: at least ``keep_runs`` remain.
    """
    if not rules.limited:
        return None
    bounds = []
    if rules.keep_runs is not None:
        if nth_newest is None:
            return None
        bounds.append(nth_newest)
    if rules.keep_runs_for is not None:
        bounds.append(now - rules.keep_runs_for)
    before = min(bounds)
    failed_before = before
    if rules.keep_failed_runs_for is not None:
        failed_before = min(before, now - rules.keep_failed_runs_for)
    return Cutoffs(before, failed_before)


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
) -> Iterator[Pruned]:
    """Delete the finished runs (and their leases) that no rule keeps, then, with
    ``versions``, the versions past each schedule's newest ``KEEP_VERSIONS``, yielding what
    each batch deleted; ``dry_run`` counts them instead, one count per batch of schedules.

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
        for prunable in _prunables(now, rules, using):
            if dry_run:
                yield _count(prunable)
                continue
            for deleted in delete_in_batches(prunable, batch_size, using):
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


def _prunables(now: datetime, rules: Rules, using: str) -> Iterator[RunQuerySet]:
    """The finished runs that no rule keeps: those of the schedules kept by age alone in one
    set, whatever their number; then those of the schedules with a count rule, a batch of
    schedules at a time."""
    by_age = _by_age(now, rules, using)
    if by_age is not None:
        yield by_age
    for by_schedule in _schedule_batches(now, rules, using):
        yield _prunable(by_schedule, using)


def _by_age(now: datetime, rules: Rules, using: str) -> RunQuerySet | None:
    """The finished runs that the schedules without a count rule let go (None: they keep
    every run). One statement reads their distinct age rules, a few rows however many
    schedules share them; each rule's cutoffs come from ``cutoffs()``, as for the others.
    Each rule's runs are bounded by plan time, read on the index on it."""
    if rules.keep_runs is not None:
        return None  # every schedule has a count rule: _schedule_batches() has them all
    schedules = Schedule.objects.using(using).filter(keep_runs__isnull=True)
    own = schedules.values_list("keep_runs_for", "keep_failed_runs_for").distinct()
    condition = Q()
    for keep_runs_for, keep_failed_runs_for in own.order_by():
        cut = cutoffs(rules.overridden_by(None, keep_runs_for, keep_failed_runs_for), now, None)
        if cut is None:
            continue
        older = Q(
            schedule__keep_runs__isnull=True,
            plan_time__lt=cut.before,
            **_same("schedule__keep_runs_for", keep_runs_for),
            **_same("schedule__keep_failed_runs_for", keep_failed_runs_for),
        )
        if cut.failed_before < cut.before:
            older &= ~Q(status=Run.Status.FAILED) | Q(plan_time__lt=cut.failed_before)
        condition |= older
    if not condition:
        return None
    return Run.objects.using(using).finished().filter(condition)


def _same(field: str, value: object) -> dict[str, object]:
    """A lookup of ``field`` equal to ``value``, None included."""
    return {f"{field}__isnull": True} if value is None else {field: value}


def _schedule_batches(now: datetime, rules: Rules, using: str) -> Iterator[dict[int, Cutoffs]]:
    """The cutoffs of the schedules with a count rule that delete anything, a batch of
    schedules at a time (two statements each)."""
    schedules = Schedule.objects.using(using).order_by("pk")
    if rules.keep_runs is None:
        # Only schedules with a count rule of their own: _by_age() has the others.
        schedules = schedules.filter(keep_runs__isnull=False)
    after = 0
    while True:
        rows = list(
            schedules.filter(pk__gt=after).values_list("pk", *RETENTION_FIELDS)[:SCHEDULE_BATCH]
        )
        if not rows:
            return
        own = {row[0]: rules.overridden_by(*row[1:]) for row in rows}
        nth = _nth_newest({pk: r.keep_runs for pk, r in own.items() if r.keep_runs}, using)
        found = {pk: cutoffs(r, now, nth.get(pk)) for pk, r in own.items()}
        by_schedule = {pk: cut for pk, cut in found.items() if cut is not None}
        if by_schedule:
            yield by_schedule
        if len(rows) < SCHEDULE_BATCH:
            return
        after = rows[-1][0]


def _nth_newest(counts: dict[int, int], using: str) -> dict[int, datetime]:
    """Each schedule's ``counts[pk]``-th newest finished run's plan time (one statement; a
    schedule with fewer finished runs is left out).

    One short read of the history index per schedule: OFFSET must be a constant, so the
    schedules are grouped by count.
    """
    if not counts:
        return {}
    newest = (
        Run.objects.filter(schedule=OuterRef("pk"), status__in=Run.FINAL_STATUSES)
        .order_by("-plan_time", "-pk")
        .values("plan_time")
    )
    by_count: dict[int, list[int]] = {}
    for pk, count in counts.items():
        by_count.setdefault(count, []).append(pk)
    nth = Case(
        *(
            When(pk__in=pks, then=Subquery(newest[count - 1 : count]))
            for count, pks in by_count.items()
        ),
        default=Value(None),
        output_field=DateTimeField(),
    )
    rows = Schedule.objects.using(using).filter(pk__in=counts).annotate(nth=nth)
    return {pk: at for pk, at in rows.values_list("pk", "nth") if at is not None}


def _prunable(by_schedule: dict[int, Cutoffs], using: str) -> RunQuerySet:
    """The finished runs of these schedules that their cutoffs let go."""
    alike: dict[Cutoffs, list[int]] = {}
    for pk, cut in by_schedule.items():
        alike.setdefault(cut, []).append(pk)
    condition = Q()
    for cut, pks in alike.items():
        older = Q(schedule_id__in=pks, plan_time__lt=cut.before)
        if cut.failed_before < cut.before:
            older &= ~Q(status=Run.Status.FAILED) | Q(plan_time__lt=cut.failed_before)
        condition |= older
    return Run.objects.using(using).finished().filter(condition)


def prune_versions(keep: int, *, using: str = "default", dry_run: bool = False) -> Iterator[int]:
    """Delete each schedule's versions but its newest ``keep`` (by id: the order they were
    recorded in), yielding how many each batch of schedules lost (``dry_run``: would lose).

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
            return
        after = rows[-1][0]


def _count(prunable: RunQuerySet) -> Pruned:
    leases = Lease.objects.using(prunable.db).filter(run__in=prunable.values("pk"))
    return Pruned(prunable.count(), leases.count())


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


def delete_in_batches(prunable: RunQuerySet, batch_size: int, using: str) -> Iterator[Pruned]:
    """Delete ``prunable`` batch by batch, yielding what each batch deleted.

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
                prunable.filter(pk__gt=after)
                .order_by("pk")
                .values_list("pk", flat=True)[:batch_size]
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
