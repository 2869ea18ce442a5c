"""Reads through the ORM: the scheduler's look ahead, one aggregate per time of the horizon
(``loop/scheduler.look_ahead``); and for the admin and the health report, a page's recent runs,
the fire lag's percentiles (``admin/history.py``, ``operations/health.py``), runs and lag
over time (the overview page, ``admin/overview``)."""

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Expression, F, Min, Q, QuerySet, Window
from django.db.models.functions import RowNumber, TruncHour, TruncMinute

from django_periodic.db import clock
from django_periodic.engine.records import Bucket, Horizon, truncated
from django_periodic.models import Lease, Run, Schedule
from django_periodic.models.run import CLAIMABLE_STATUSES, DEADLINE_WATCHED, RELEASE

LAG_SAMPLE = 10_000
# The runs whose start measures the scheduler's promptness: first attempts (a retry's start
# says nothing of it), not backfilled (released long after their plan time on purpose).
LAGGED = Q(attempt=1) & ~Q(trigger=Run.Trigger.BACKFILL)
# A series reads the runs started in its window through the plan time index: those planned
# up to this long before the window starts (a run started later than that is left out).
PLANNED_BEFORE = timedelta(hours=1)
# A series' buckets: a minute or an hour, cut in UTC.
UNITS = ("minute", "hour")


def earliest(using: str, jobs: tuple[str, ...]) -> dict[str, tuple[QuerySet[Any], Expression | F]]:
    """Each time of the horizon: the rows it is the earliest of, and of which column (or
    expression). One home for both paths: the ORM reads these, PostgreSQL's statement is
    built from them. Runs our workers execute count only if their job is one of ``jobs``,
    this process's (fleet.py): a run only another release can execute is no work for us."""
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
        # As periodic_run_deadline indexes them: empty where no schedule has a deadline.
        "next_deadline": (runs.filter(DEADLINE_WATCHED), F("finish_by")),
    }


def look_ahead(using: str, jobs: tuple[str, ...]) -> Horizon:
    """The horizon now, one aggregate per time (no session locks here: no process is known
    to have died but by its lease's expiry)."""
    at = {
        name: rows.aggregate(at=Min(column))["at"]
        for name, (rows, column) in earliest(using, jobs).items()
    }
    return Horizon(now=clock.now(using), **at)


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
    "duration",
)  # fmt: skip


def recent_runs(ids: list[int], using: str, limit: int) -> Iterable[tuple[Any, ...]]:
    """The newest ``limit`` runs of each schedule (a window function ranks them), unsorted."""
    newest_first = [F("plan_time").desc(), F("pk").desc()]
    rank = Window(RowNumber(), partition_by=F("schedule_id"), order_by=newest_first)
    ranked = Run.objects.using(using).filter(schedule_id__in=ids).annotate(rank=rank)
    return ranked.filter(rank__lte=limit).order_by().values_list(*RECENT_RUN_FIELDS)


def fire_lag(since: datetime, using: str) -> tuple[int, timedelta | None, timedelta | None]:
    """How many first attempts started since ``since``, and their lag's p50 and p99."""
    started = Run.objects.using(using).filter(LAGGED, started_at__gte=since)
    # Bounded: on SQLite (one process, development) the latest runs are sample enough.
    rows = started.order_by("-started_at").values_list("started_at", RELEASE)[:LAG_SAMPLE]
    lags = sorted(started_at - release for started_at, release in rows if started_at)
    return len(lags), _percentile(lags, 0.5), _percentile(lags, 0.99)


# One bucket of a series: its start (UTC), the runs started in it, its lag's p50 and p99.


def series_window(since: datetime, until: datetime) -> Q:
    """Runs started in [``since``, ``until``), found by their plan time (``PLANNED_BEFORE``)."""
    return Q(
        plan_time__gte=since - PLANNED_BEFORE,
        plan_time__lt=until,
        started_at__gte=since,
        started_at__lt=until,
    )


def run_series(since: datetime, until: datetime, unit: str, using: str) -> list[Bucket]:
    """Runs started in the window counted per ``unit`` (exactly), with the lag percentiles
    of the latest ``LAG_SAMPLE`` of them (on SQLite a sample is enough: development)."""
    trunc = {"minute": TruncMinute, "hour": TruncHour}[unit]
    runs = Run.objects.using(using).filter(series_window(since, until))
    counted = runs.annotate(bucket=trunc("started_at", tzinfo=UTC)).values("bucket")
    counts = counted.annotate(n=Count("pk")).order_by("bucket").values_list("bucket", "n")
    lagged = runs.filter(LAGGED).order_by("-started_at").values_list("started_at", RELEASE)
    lags: dict[datetime, list[timedelta]] = defaultdict(list)
    for started_at, release in lagged[:LAG_SAMPLE]:
        lags[truncated(started_at, unit)].append(started_at - release)
    buckets = []
    for bucket, n in counts:
        ordered = sorted(lags.get(truncated(bucket, unit), []))
        buckets.append((bucket, n, _percentile(ordered, 0.5), _percentile(ordered, 0.99)))
    return buckets
