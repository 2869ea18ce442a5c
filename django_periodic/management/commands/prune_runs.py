from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, transaction
from django.db.models import QuerySet, signals

from django_periodic import clock
from django_periodic.models import Lease, Run, RunQuerySet

DEFAULT_BATCH_SIZE = 5000


class Command(BaseCommand):
    help = (
        "Delete finished runs (and their leases) planned more than --days ago, in batches. "
        "Active runs are kept, and schedule cursors keep old plan times from firing again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, default=30, help="Keep this many days (30).")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Runs deleted per transaction ({DEFAULT_BATCH_SIZE}; at most 999 on SQLite).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument("--database", default="default", help="Database alias to use.")

    def handle(
        self,
        *args: Any,
        days: int,
        batch_size: int,
        dry_run: bool,
        database: str,
        verbosity: int,
        **options: Any,
    ) -> None:
        if days < 0:
            raise CommandError("--days must not be negative.")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        cutoff = clock.now(database) - timedelta(days=days)
        prunable = Run.objects.using(database).finished().filter(plan_time__lt=cutoff)
        if dry_run:
            runs = prunable.count()
            leases = Lease.objects.using(database).filter(run__in=prunable).count()
            self._report("Would delete", runs, leases, cutoff)
            return
        runs = leases = 0
        for batch_runs, batch_leases in _delete_in_batches(prunable, batch_size, database):
            runs, leases = runs + batch_runs, leases + batch_leases
            if verbosity >= 2:
                self.stdout.write(f"  {runs} runs and {leases} leases deleted so far")
        self._report("Deleted", runs, leases, cutoff)

    def _report(self, verb: str, runs: int, leases: int, cutoff: datetime) -> None:
        self.stdout.write(
            f"{verb} {runs} runs and {leases} leases planned before {cutoff:%Y-%m-%d %H:%M}."
        )


def _delete_in_batches(
    prunable: RunQuerySet, batch_size: int, using: str
) -> Iterator[tuple[int, int]]:
    """Delete ``prunable`` batch by batch, yielding (runs, leases) deleted by each batch.

    Each batch is its own short transaction, so locks are held briefly and a long prune
    can be interrupted without losing what was done. Batches walk the primary key
    upwards, so no batch rescans rows (or the dead index entries) of the ones before.
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
            deleted = _delete_batch(pks, using) if pks else (0, 0)
        if pks:
            yield deleted
        if len(pks) < batch_size:
            return
        after = pks[-1]


def _delete_batch(pks: list[int], using: str) -> tuple[int, int]:
    """Delete these runs and their leases; return (runs, leases).

    Leases go first, by run id, so the runs have nothing left to cascade to and can be
    deleted by primary key. Finished runs never change status again and get no new
    lease, so the ids selected stay safe to delete.
    """
    leases = _delete(Lease.objects.using(using).filter(run_id__in=pks))
    runs = _delete(Run.objects.using(using).filter(pk__in=pks))
    return runs, leases


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
