"""Recent runs of the schedules on a page, in one query however many schedules and runs."""

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import OuterRef, Subquery

from django_periodic.engine.backends import ledger
from django_periodic.models import Run

STRIP_LENGTH = 20
# A fanned-out schedule's page reads at most this many of its newest runs for the latest run
# of each scope: a bounded read off its history index, however long the history.
SCOPE_STATUS_RUNS = 20_000


class RunSummary(NamedTuple):
    # The fields of RECENT_RUN_FIELDS, in its order.
    pk: int
    schedule_id: int
    status: str
    plan_time: datetime
    trigger: str
    error_code: str
    schedule_revision: int | None
    duration: timedelta | None = None


def recent_runs(
    schedule_ids: Iterable[int], using: str = "default", limit: int = STRIP_LENGTH
) -> dict[int, list[RunSummary]]:
    """The last ``limit`` runs of each schedule by plan time, newest first.

    On PostgreSQL each schedule reads only its newest rows from the history index, so a
    schedule with a million runs costs what one with twenty does; elsewhere a window
    function ranks the runs of these schedules.
    """
    ids = sorted(set(schedule_ids))
    if not ids:
        return {}
    rows: Iterable[tuple[Any, ...]]
    rows = ledger(using).recent_runs(ids, using, limit)
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


class ScopeRun(NamedTuple):
    pk: int
    scope: str
    status: str
    plan_time: datetime
    error_code: str


def latest_by_scope(
    schedule_id: int, using: str = "default", limit: int = SCOPE_STATUS_RUNS
) -> tuple[list[ScopeRun], bool]:
    """The newest run of each scope of a fanned-out schedule, among its newest ``limit``
    runs, and whether those were all its scoped runs (else older scopes may be missing)."""
    runs = Run.objects.using(using).filter(schedule_id=schedule_id).exclude(scope="")
    fields = ("pk", "scope", "status", "plan_time", "error_code")
    newest = runs.order_by("-plan_time", "-pk").values_list(*fields)[: limit + 1]
    latest: dict[str, ScopeRun] = {}
    rows = list(newest)
    for row in rows[:limit]:
        latest.setdefault(row[1], ScopeRun(*row))
    return list(latest.values()), len(rows) <= limit
