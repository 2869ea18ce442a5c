"""What needs attention, and the status report around it.

One home for each rule: ``periodic_status``, the health view and the django-health-check
check all ask :func:`attention`; the command's report comes from :func:`gather`. Both are
functions of an explicit ``now`` (the database's clock) and cost a constant number of
queries however many schedules, runs and processes there are. They and the values they
return (:class:`Problem`, :class:`Report`, :class:`Lag`) are public, at this path.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F

from django_periodic.conf import get_settings
from django_periodic.engine.backends import ledger
from django_periodic.models import (
    Lease,
    LeaseQuerySet,
    Run,
    RunQuerySet,
    Schedule,
    ScheduleQuerySet,
    SchedulerProcess,
    SchedulerProcessQuerySet,
)
from django_periodic.models.schedule_fields import ALERT_FIELDS, ATTENTION_FIELDS

# A row of a report's section: column name to value (times aware, UTC).
Row = Mapping[str, Any]

# Each check's name: stable, in the JSON of the command and of the health view.
NO_LIVE_SCHEDULER = "no_live_scheduler"
UNSWEPT_LEASES = "unswept_leases"
DISABLED_BY_ERRORS = "disabled_by_errors"
SCHEDULES_NEED_ATTENTION = "schedules_need_attention"

# How far ahead "due soon" looks, and the windows of the failures and of the fire lag.
DUE_AHEAD = timedelta(hours=1)
FAILURES_WINDOW = timedelta(hours=24)
LAG_WINDOW = timedelta(hours=1)
# Rows listed per section (counts are exact); lags read on databases without percentile_cont.
LISTED = 20


@dataclass(frozen=True)
class Problem:
    """One thing an operator must look at: a check's name and a sentence."""

    check: str
    message: str


@dataclass(frozen=True)
class Lag:
    """How late runs started after their plan time (first attempts started in the window)."""

    runs: int
    p50: timedelta | None
    p99: timedelta | None


@dataclass(frozen=True)
class Report:
    """Everything ``periodic_status`` shows; rows are dicts with stable keys."""

    now: datetime
    problems: list[Problem]
    schedulers: list[Row]
    runs_by_status: dict[str, int]
    due_soon: list[Row]
    running: list[Row]
    expired_leases: list[Row]
    schedule_errors: list[Row]
    needing_attention: list[Row]
    paused: list[Row]
    failures: int
    latest_failures: list[Row]
    failures_by_scope: list[Row]
    more_failing_scopes: int
    lag: Lag


def attention(now: datetime, using: str = "default", *, names: bool = False) -> list[Problem]:
    """The signs of a broken setup, one :class:`Problem` each; empty when all is well.

    Each allows the slack a healthy setup needs (a heartbeat or a sweep a little late),
    so that a live scheduler between two ticks is not reported. Schedules needing
    attention (by their alerts, as the scheduler last judged) are counted, or with
    ``names`` named: only for those who may view schedules. Five queries.
    """
    stale_after = SchedulerProcess.stale_after()
    sweep_interval = get_settings().SWEEP_INTERVAL
    schedules = Schedule.objects.using(using)
    found = []
    overdue = late(now, using).count()
    if overdue and not _alive(now, using).exists():
        found.append(
            Problem(
                NO_LIVE_SCHEDULER,
                f"no live scheduler process, and {overdue} schedule(s) due for over "
                f"{_seconds(stale_after)}",
            )
        )
    unswept = Lease.objects.using(using).expired(now - sweep_interval).count()
    if unswept:
        found.append(
            Problem(
                UNSWEPT_LEASES,
                f"{unswept} lease(s) expired over {_seconds(sweep_interval)} ago and not swept",
            )
        )
    disabled = schedules.filter(enabled=False).exclude(last_error="").count()
    if disabled:
        found.append(Problem(DISABLED_BY_ERRORS, f"{disabled} schedule(s) disabled by errors"))
    if needing := _needing_attention(schedules, names):
        found.append(Problem(SCHEDULES_NEED_ATTENTION, needing))
    return found


def late(now: datetime, using: str = "default") -> ScheduleQuerySet:
    """Schedules due for longer than a live scheduler lets one wait (its heartbeat's
    staleness: ``SchedulerProcess.stale_after()``), the most overdue first."""
    return Schedule.objects.using(using).due(now - SchedulerProcess.stale_after())


def _needing_attention(schedules: ScheduleQuerySet, names: bool) -> str:
    """How many schedules need attention, or which (the first ``LISTED``); "" if none."""
    needing = schedules.needing_attention()
    if not names:
        count = needing.count()
        return f"{count} schedule(s) need attention" if count else ""
    listed = list(needing.order_by("name").values_list("name", flat=True)[: LISTED + 1])
    if not listed:
        return ""
    more = ", and more" if len(listed) > LISTED else ""
    return f"schedule(s) need attention: {', '.join(listed[:LISTED])}{more}"


def gather(now: datetime, using: str = "default") -> Report:
    """The status report as of ``now``: each list bounded to ``LISTED`` (20) rows. Its
    problems name the schedules needing attention: it is the operator's report."""
    failed = Run.objects.using(using).failed().filter(finished_at__gte=now - FAILURES_WINDOW)
    by_scope, more_scopes = _failures_by_scope(failed)
    errors = Schedule.objects.using(using).exclude(last_error="").order_by("name")
    return Report(
        now=now,
        problems=attention(now, using, names=True),
        schedulers=_schedulers(now, using),
        runs_by_status=_runs_by_status(using),
        due_soon=_due_soon(now, using),
        running=_running(using),
        expired_leases=_expired_leases(now, using),
        schedule_errors=list(
            errors.values("name", "enabled", "planning_failures", "last_error")[:LISTED]
        ),
        needing_attention=needing_attention(using),
        paused=_paused(now, using),
        failures=failed.count(),
        latest_failures=list(
            failed.order_by("-finished_at", "-pk").values(
                "scope",
                "plan_time",
                "finished_at",
                "error_code",
                run_id=F("id"),
                job=F("job_name"),
            )[:LISTED]
        ),
        failures_by_scope=by_scope,
        more_failing_scopes=more_scopes,
        lag=fire_lag(now, using),
    )


def fire_lag(now: datetime, using: str = "default") -> Lag:
    """p50 and p99 of the lag, ``started_at`` less the release (``RELEASE``: the plan time,
    or later by a stagger), over first attempts started in the last
    :data:`LAG_WINDOW` (a retry's start says nothing about the scheduler's promptness, nor
    does a backfilled run's, released long after its plan time on purpose)."""
    return Lag(*ledger(using).fire_lag(now - LAG_WINDOW, using))


def _alive(now: datetime, using: str) -> SchedulerProcessQuerySet:
    return SchedulerProcess.objects.using(using).alive(now)


def _schedulers(now: datetime, using: str) -> list[Row]:
    processes = SchedulerProcess.objects.using(using).order_by("-heartbeat_at", "pk")
    return [
        {
            "name": str(process),
            "host": process.host,
            "pid": process.pid,
            "started_at": process.started_at,
            "heartbeat_at": process.heartbeat_at,
            "alive": process.alive_at(now),
        }
        for process in processes[:LISTED]
    ]


def needing_attention(using: str = "default") -> list[Row]:
    """The schedules needing attention, those needing it longest first: name, reason (an
    ``AttentionReason``), since and the reason in words (``message``)."""
    needing = Schedule.objects.using(using).needing_attention()
    listed = needing.order_by("attention_since", "name")[:LISTED]
    return [
        {
            "name": schedule.name,
            "reason": schedule.attention_reason,
            "since": schedule.attention_since,
            "message": schedule.attention_note,
        }
        # What attention_note reads: the reason and the thresholds it names.
        for schedule in listed.only("name", *ATTENTION_FIELDS, *ALERT_FIELDS)
    ]


def _paused(now: datetime, using: str) -> list[Row]:
    paused = Schedule.objects.using(using).paused(now).order_by("paused_until")
    return list(paused.values("name", "paused_until", "paused_by", "pause_reason")[:LISTED])


def _runs_by_status(using: str) -> dict[str, int]:
    rows = Run.objects.using(using).values("status").annotate(n=Count("pk")).order_by("status")
    return {row["status"]: row["n"] for row in rows}


def _due_soon(now: datetime, using: str) -> list[Row]:
    due = Schedule.objects.using(using).due(now + DUE_AHEAD)
    return list(due.values("name", "next_fire_at")[:LISTED])


def running_leases(using: str = "default") -> LeaseQuerySet:
    """The current leases of running runs, the longest running first (what runs now)."""
    leases = Lease.objects.using(using).held().filter(run__status=Run.Status.RUNNING)
    return leases.order_by("run__started_at", "run_id")


def _running(using: str) -> list[Row]:
    """Running runs with the holder and expiry of their current lease."""
    rows = list(
        running_leases(using).values(
            "run_id",
            "holder",
            "expires_at",
            job=F("run__job_name"),
            scope=F("run__scope"),
            run_started_at=F("run__started_at"),  # the lease has a started_at of its own
        )[:LISTED]
    )
    return [_renamed(row, "run_started_at", "started_at") for row in rows]


def _renamed(row: Row, old: str, new: str) -> Row:
    return {(new if key == old else key): value for key, value in row.items()}


def _expired_leases(now: datetime, using: str) -> list[Row]:
    expired = Lease.objects.using(using).expired(now).order_by("expires_at", "pk")
    return list(expired.values("run_id", "holder", "expires_at", job=F("run__job_name"))[:LISTED])


def _failures_by_scope(failed: RunQuerySet) -> tuple[list[Row], int]:
    """Failed runs of fanned-out schedules counted by (schedule, scope), most first: the
    tenants (accounts, ...) whose runs keep failing; and how many more scopes failed."""
    by_scope = (
        failed.exclude(scope="")
        .values("scope", schedule_name=F("schedule__name"))
        .annotate(failed=Count("pk"))
        .order_by("-failed", "schedule_name", "scope")
    )
    listed: list[Row] = list(by_scope[: LISTED + 1])
    if len(listed) <= LISTED:
        return listed, 0
    return listed[:LISTED], by_scope.count() - LISTED


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():.0f} s"
