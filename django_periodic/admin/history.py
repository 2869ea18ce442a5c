"""Recent runs of the schedules on a page, in one query however many schedules and runs."""

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from django.db import connections
from django.db.models import F, OuterRef, Subquery, Window
from django.db.models.functions import RowNumber

from django_periodic.models import Run

STRIP_LENGTH = 20
_FIELDS = ("pk", "schedule_id", "status", "plan_time", "trigger", "error_code")


class RunSummary(NamedTuple):
    pk: int
    schedule_id: int
    status: str
    plan_time: object
    trigger: str
    error_code: str


def recent_runs(
    schedule_ids: Iterable[int], using: str = "default", limit: int = STRIP_LENGTH
) -> dict[int, list[RunSummary]]:
    """The last ``limit`` runs of each schedule by plan time, newest first.

    Where the database can, each schedule reads only its newest rows from the history
    index, so a schedule with a million runs costs what one with twenty does; elsewhere a
    window function ranks the runs of these schedules.
    """
    ids = sorted(set(schedule_ids))
    if not ids:
        return {}
    runs = Run.objects.using(using)
    newest_first = [F("plan_time").desc(), F("pk").desc()]
    if connections[using].features.supports_slicing_ordering_in_compound:
        parts = [
            runs.filter(schedule_id=pk).order_by(*newest_first).values_list(*_FIELDS)[:limit]
            for pk in ids
        ]
        rows = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
    else:
        rank = Window(RowNumber(), partition_by=F("schedule_id"), order_by=newest_first)
        ranked = runs.filter(schedule_id__in=ids).annotate(rank=rank).filter(rank__lte=limit)
        rows = ranked.order_by().values_list(*_FIELDS)
    grouped: dict[int, list[RunSummary]] = defaultdict(list)
    for row in rows:
        grouped[row[1]].append(RunSummary(*row))
    for group in grouped.values():
        group.sort(key=lambda run: (run.plan_time, run.pk), reverse=True)
    return dict(grouped)


def last_status() -> Subquery:
    """The status of a schedule's newest run by plan time, for filtering a schedule queryset."""
    newest = Run.objects.filter(schedule=OuterRef("pk")).order_by("-plan_time", "-pk")
    return Subquery(newest.values("status")[:1])
