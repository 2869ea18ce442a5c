"""Reads for the admin and the health report through the ORM: a page's recent runs, the
fire lag's percentiles (``admin/history.py``, ``operations/health.py``)."""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from django_periodic.models import (
    RELEASE,
    Run,
)

LAG_SAMPLE = 10_000


def _percentile(ordered: list[timedelta], fraction: float) -> timedelta | None:
    """PostgreSQL's percentile_cont: linear interpolation between the two nearest values."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


#: What the admin's strip of recent runs reads of each run, in ``RunSummary``'s order.
RECENT_RUN_FIELDS = (
    "pk", "schedule_id", "status", "plan_time", "trigger", "error_code", "schedule_revision",
)  # fmt: skip


def recent_runs(ids: list[int], using: str, limit: int) -> Iterable[tuple[Any, ...]]:
    """The newest ``limit`` runs of each schedule (a window function ranks them), unsorted."""
    newest_first = [F("plan_time").desc(), F("pk").desc()]
    rank = Window(RowNumber(), partition_by=F("schedule_id"), order_by=newest_first)
    ranked = Run.objects.using(using).filter(schedule_id__in=ids).annotate(rank=rank)
    return ranked.filter(rank__lte=limit).order_by().values_list(*RECENT_RUN_FIELDS)


def fire_lag(since: datetime, using: str) -> tuple[int, timedelta | None, timedelta | None]:
    """How many first attempts started since ``since``, and their lag's p50 and p99."""
    started = Run.objects.using(using).filter(attempt=1, started_at__gte=since)
    started = started.exclude(trigger=Run.Trigger.BACKFILL)
    # Bounded: on SQLite (one process, development) the latest runs are sample enough.
    rows = started.order_by("-started_at").values_list("started_at", RELEASE)[:LAG_SAMPLE]
    lags = sorted(started_at - release for started_at, release in rows if started_at)
    return len(lags), _percentile(lags, 0.5), _percentile(lags, 0.99)
