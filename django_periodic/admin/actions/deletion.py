"""Deleting schedules with their history: what the confirmation shows, and the delete itself.

A schedule's runs, and their leases, are its history: they go with it, and whoever may
delete the schedule may delete them (the run and lease pages themselves never delete; the
retention rules do). A schedule may have millions of runs, so the confirmation counts them
instead of listing every row, and the delete removes them in batches by primary key instead
of loading them, as Django's own confirmation and delete would.
"""

from collections import Counter
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.models import Count, Model, QuerySet
from django.utils.formats import number_format
from django.utils.safestring import SafeString
from django.utils.text import capfirst

from django_periodic.models import FireOverride, Lease, Run, Schedule, ScheduleVersion
from django_periodic.operations import retention

# Runs (with their leases) deleted per statement; all in the one transaction of the delete.
HISTORY_BATCH = 10_000
HISTORY = (Run, Lease)
# A schedule's own small tables (a row per change, per overridden fire): Django's cascade
# deletes them with it.
OWN_ROWS = (ScheduleVersion, FireOverride)


def history_only() -> bool:
    """Whether runs, leases and the schedule's own rows (``OWN_ROWS``) are all that point at
    schedules (and runs, and leases): no model of the project cascades from them, or
    protects them, where counts would not say."""
    pointing = {
        relation.related_model
        for model in (Schedule, *HISTORY)
        for relation in model._meta.related_objects
    }
    return pointing <= {*HISTORY, *OWN_ROWS}


def summary(
    schedules: Iterable[Schedule], link: Callable[[Schedule], SafeString]
) -> tuple[list[SafeString | list[str]], dict[str, str]]:
    """What deleting ``schedules`` deletes, for Django's confirmation page: each schedule
    (``link``), with its counts of runs and leases, and the totals by model.

    Two counting queries, however long the history.
    """
    schedules = list(schedules)
    ids = [schedule.pk for schedule in schedules]
    using = schedules[0]._state.db if schedules else None
    runs = _count_by_schedule(Run.objects.using(using).filter(schedule_id__in=ids), "schedule_id")
    leases = _count_by_schedule(
        Lease.objects.using(using).filter(run__schedule_id__in=ids), "run__schedule_id"
    )
    listed: list[SafeString | list[str]] = []
    for schedule in schedules:
        listed.append(link(schedule))
        history = _counts({Run: runs[schedule.pk], Lease: leases[schedule.pk]})
        if history:
            listed.append([f"{name}: {count}" for name, count in history.items()])
    totals: dict[type[Model], int] = {
        Schedule: len(schedules),
        Run: runs.total(),
        Lease: leases.total(),
    }
    return listed, _counts(totals)


def _count_by_schedule(rows: QuerySet[Run] | QuerySet[Lease], schedule: str) -> Counter[int]:
    # order_by(): a model's default ordering would split the groups.
    counts = rows.order_by().values_list(schedule).annotate(count=Count("pk"))
    return Counter(dict(counts))


def _counts(counts: dict[type[Model], int]) -> dict[str, str]:
    """Each count by its model's plural name ("Runs": "100,000"); none for a count of 0."""
    return {
        str(capfirst(model._meta.verbose_name_plural)): number_format(count, force_grouping=True)
        for model, count in counts.items()
        if count
    }


def delete_with_history(schedules: QuerySet[Schedule]) -> None:
    """Delete ``schedules`` with their runs and leases, in one transaction."""
    using = schedules.db
    with transaction.atomic(using=using):
        # Locked first, so that no planner (which skips locked schedules) records a run
        # between the delete of their history and their own.
        locked = Schedule.objects.using(using).select_for_update()
        ids = list(locked.filter(pk__in=schedules.values("pk")).values_list("pk", flat=True))
        history = Run.objects.using(using).filter(schedule_id__in=ids)
        # Retention's delete: by primary key, and through Django's collector only where
        # project code hooks into deleting runs or leases.
        for _ in retention.delete_in_batches(history, HISTORY_BATCH, using):
            pass
        Schedule.objects.using(using).filter(pk__in=ids).delete()
