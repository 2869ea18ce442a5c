"""What the overview page shows, read in a constant number of queries whatever the number
of schedules and runs: each section bounded, the runs read through existing indexes only
(the plan time index for failures and series, the history index for the strips)."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Case, F, IntegerField, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.utils.translation import gettext as _

from django_periodic.admin import display, history
from django_periodic.admin.limits import run_count
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import truncated
from django_periodic.models import ConcurrencyLimit, Run, Schedule, limits
from django_periodic.models.calendars import closures_of
from django_periodic.models.trigger_rows import open_trigger_of
from django_periodic.operations import health
from django_periodic.timing import triggers

# Schedules per page, and the runs each strip shows.
PER_PAGE = 50
STRIP_RUNS = 50
# How far ahead the timeline looks, and the fires computed at most per schedule (a
# per-minute schedule's 1,440 would cost more than the rest of the page).
AHEAD = timedelta(hours=24)
TIMELINE_FIRES = 100
# The failed runs listed: of fires planned in health's window of failures.
FAILED_WINDOW = health.FAILURES_WINDOW
LISTED = health.LISTED

Row = Mapping[str, Any]

# How long a run may wait for its limit, ready to start, before the overview flags the limit.
FULL_FOR = timedelta(minutes=1)

# Each chart's window and bucket, and each bucket's length.
WINDOWS = {"hour": (timedelta(hours=1), "minute"), "day": (timedelta(days=1), "hour")}
STEPS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1)}


@dataclass(frozen=True)
class Series:
    """Runs started per bucket over a window, with their start lag's percentiles."""

    since: datetime
    until: datetime
    unit: str  # "minute" or "hour"
    starts: list[datetime]
    runs: list[int]
    p50: list[timedelta | None]
    p99: list[timedelta | None]

    @property
    def step(self) -> timedelta:
        return STEPS[self.unit]

    @property
    def total(self) -> int:
        return sum(self.runs)


@dataclass(frozen=True)
class Timeline:
    """A schedule's fires in the next ``AHEAD``: those computed (at most
    ``TIMELINE_FIRES``), whether there are more, or why none can be computed."""

    fires: list[datetime]
    more: bool = False
    note: str = ""


@dataclass(frozen=True)
class ScheduleRow:
    schedule: Schedule
    runs: list[history.RunSummary]
    timeline: Timeline


def running(now: datetime, using: str) -> list[Row]:
    """Running runs (health's rule) with their lease's holder and how long they have run,
    the longest running first."""
    leases = health.running_leases(using).values(
        "run_id", "holder", schedule_id=F("run__schedule_id"),
        schedule_name=F("run__schedule__name"), scope=F("run__scope"),
        started_at_of_run=F("run__started_at"),
    )  # fmt: skip
    return [{**row, "elapsed": _elapsed(row["started_at_of_run"], now)} for row in leases[:LISTED]]


def _elapsed(started_at: datetime | None, now: datetime) -> str:
    return display.duration(now - started_at) if started_at else ""


def failed(now: datetime, using: str) -> list[Row]:
    """Failed runs of the fires planned in the last day, newest first (through the plan time
    index: a run failed today of a fire planned before is in the run list, not here)."""
    runs = Run.objects.using(using).failed()
    recent = runs.filter(plan_time__gte=now - FAILED_WINDOW).order_by("-plan_time", "-pk")
    return list(
        recent.values(
            "pk", "schedule_id", "scope", "plan_time", "finished_at", "error_code",
            "error_message", schedule_name=F("schedule__name"),
        )[:LISTED]
    )  # fmt: skip


def late(now: datetime, using: str) -> list[Row]:
    """Schedules due for longer than a live scheduler lets one wait (health's rule)."""
    return list(health.late(now, using).values("pk", "name", "next_fire_at")[:LISTED])


def needing_attention(using: str) -> list[Row]:
    """Schedules needing attention by their alerts (health's rule), longest first."""
    return health.needing_attention(using)


def full_limits(now: datetime, using: str) -> list[Row]:
    """Concurrency limits that stay full, in one query: a run waiting for a slot though its
    release passed over ``FULL_FOR`` ago (admission, each second, would have admitted it
    into a free slot), and every slot it could take held: its limit's, or for a per-scope
    limit its own key's. The longest waiting first."""
    key_holding = run_count(
        limits.HOLDING, of=OuterRef("concurrency_limit"), scope=OuterRef("scope")
    )
    ready = (
        Run.objects.using(using)
        .filter(limits.WAITING, concurrency_limit=OuterRef("pk"))
        .filter(plan_time__lt=now - FULL_FOR)  # its index's range; the release is the rule
        .alias(release=Coalesce("held_release_at", "plan_time"), key_holding=key_holding)
        .filter(release__lt=now - FULL_FOR)
        .filter(
            Q(concurrency_limit__per_scope=False)
            | Q(key_holding__gte=F("concurrency_limit__max_running"))
        )
        .order_by("plan_time")
        .values("plan_time")
    )
    full = (
        ConcurrencyLimit.objects.using(using)
        .annotate(
            holding=run_count(limits.HOLDING),
            waiting=run_count(limits.WAITING),
            waiting_since=Subquery(ready[:1]),
        )
        .filter(waiting_since__isnull=False)
        .filter(Q(per_scope=True) | Q(holding__gte=F("max_running")))
        .order_by("waiting_since", "name")
    )
    return list(
        full.values(
            "pk", "name", "max_running", "per_scope", "holding", "waiting", "waiting_since"
        )[:LISTED]
    )  # fmt: skip


def series(now: datetime, window: str, using: str) -> Series:
    """Runs per bucket and their lag's p50 and p99 over the ``window`` ("hour", "day") up to
    ``now``, every bucket present (zero runs, no lag where none started)."""
    length, unit = WINDOWS[window]
    step = STEPS[unit]
    count = int(length / step)
    since = truncated(now, unit) - step * (count - 1)
    found = {row[0]: row for row in ledger(using).run_series(since, now, unit, using)}
    starts = [since + step * i for i in range(count)]
    rows = [found.get(start, (start, 0, None, None)) for start in starts]
    return Series(
        since=since,
        until=now,
        unit=unit,
        starts=starts,
        runs=[row[1] for row in rows],
        p50=[row[2] for row in rows],
        p99=[row[3] for row in rows],
    )


def schedule_page(
    now: datetime, number: str | None, using: str
) -> "tuple[Page[Schedule], list[ScheduleRow]]":
    """A page of schedules, those needing attention first, then by name; each with its last
    ``STRIP_RUNS`` runs (one query for the page) and its next fires (its calendars
    prefetched: one query for the page)."""
    attention_first = Case(
        When(attention_reason="", then=Value(1)), default=Value(0), output_field=IntegerField()
    )
    schedules = (
        Schedule.objects.using(using)
        .order_by(attention_first, "name", "pk")
        .prefetch_related("calendars")
    )
    page = Paginator(schedules, PER_PAGE).get_page(number)
    listed = list(page.object_list)
    runs = history.recent_runs([s.pk for s in listed], using, limit=STRIP_RUNS)
    rows = [ScheduleRow(s, runs.get(s.pk, []), timeline(s, now)) for s in listed]
    return page, rows


def timeline(schedule: Schedule, now: datetime) -> Timeline:
    """Its fires from ``now`` to ``now + AHEAD`` (pauses, overrides and ``max_runs`` aside:
    the schedule's own page has those), none if disabled."""
    if not schedule.enabled:
        return Timeline([], note=_("disabled"))
    if schedule.has_ended:
        return Timeline([], note=_("ended"))
    start = now
    if schedule.paused_until is not None and schedule.is_paused(now):
        if schedule.paused_until >= now + AHEAD:
            return Timeline([], note=_("paused"))
        start = schedule.paused_until
    try:
        fires = _fires_before(open_trigger_of(schedule, closures_of(schedule)), start, now + AHEAD)
    except display.UNRENDERABLE as exc:  # a row stored past validation: its row says why
        return Timeline([], note=_("invalid: %(reason)s") % {"reason": exc})
    return Timeline(fires[:TIMELINE_FIRES], more=len(fires) > TIMELINE_FIRES)


def _fires_before(trigger: triggers.Trigger, after: datetime, end: datetime) -> list[datetime]:
    """Its fires after ``after`` and before ``end``: at most ``TIMELINE_FIRES`` and one (to
    tell that there are more)."""
    fires: list[datetime] = []
    while len(fires) <= TIMELINE_FIRES:
        fire = trigger.next_after(after)
        if fire is None or fire >= end:
            break
        fires.append(fire)
        after = fire
    return fires
