"""Pausing the schedules that keep failing (``pause_after_failures``, docs/policies.md,
"Lifecycle"): judged for all of them at once, from the facts attention.py gathers.

A schedule pauses itself, until resumed (``pausing.UNTIL_RESUMED``, by "scheduler"), when
its failed runs in a row reach ``pause_after_failures``: the failing rule of its alerts
(``alerting.failing``), counted from its last success, and from its last save (a resume,
an edit), so that a schedule resumed gets its threshold afresh. Only an enabled schedule
that no pause holds is judged (``watched``). Those found are locked (skipping rows another
process holds), and those still enabled and unpaused are paused in one UPDATE, their
reasons naming the failed runs, each with a version (by "scheduler");
``schedule_paused`` is sent once the transaction commits. A few queries, only when a
schedule pauses, however many.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, Value, When, Window
from django.db.models.functions import RowNumber

from django_periodic import signals
from django_periodic.choices import RunStatus
from django_periodic.db import announcements
from django_periodic.models import Run, Schedule, alerting, pausing

logger = logging.getLogger("django_periodic")

BY = "scheduler"  # paused_by of a schedule that paused itself
NAMED = 5  # the failed runs a reason names (the latest); more are counted
# What the rule reads of a schedule's row, besides its facts (attention._facts).
FACT_FIELDS = ("pause_after_failures", "updated_at", "last_success")

# A schedule's facts as attention._facts() reads them.
Row = dict[str, Any]


@dataclass(frozen=True)
class Paused:
    """A schedule that paused itself, and why."""

    schedule_id: int
    schedule: str
    reason: str


def watched(now: datetime) -> Q:
    """The schedules judged: enabled, with ``pause_after_failures``, no pause holding them."""
    return Q(enabled=True, pause_after_failures__isnull=False) & ~pausing.paused(now)


def pause_failing(rows: list[Row], now: datetime, using: str = "default") -> list[Paused]:
    """Pause every schedule of these facts whose failures in a row (since its last success
    and its last save: ``failures_since_saved``) reach ``pause_after_failures``; return
    those paused."""
    found = {
        row["pk"]: row
        for row in rows
        if row["self_pausing"]
        and alerting.failing(row["failures_since_saved"] or 0, row["pause_after_failures"])
    }
    return _pause(found, now, using) if found else []


def _pause(found: dict[int, Row], now: datetime, using: str) -> list[Paused]:
    """Pause those still unpaused and enabled once locked; announce them on commit."""
    schedules = Schedule.objects.using(using)
    with transaction.atomic(using=using):
        locked = schedules.select_for_update(skip_locked=True).filter(watched(now), pk__in=found)
        names = dict(locked.values_list("pk", "name"))
        if not names:
            return []
        failed = _failed_runs({pk: found[pk] for pk in names}, using)
        paused = [
            Paused(pk, name, _reason(found[pk], failed.get(pk, []))) for pk, name in names.items()
        ]
        reasons = Case(*(When(pk=p.schedule_id, then=Value(p.reason)) for p in paused))
        # A version of each, as a pause through pause() makes (docs/versions.md).
        schedules.filter(pk__in=names).update_versioned(
            by=BY,
            reason="Paused itself: its failed runs in a row reached pause_after_failures.",
            paused_until=pausing.UNTIL_RESUMED,
            pause_reason=reasons,
            paused_by=BY,
        )
        announcements.send_on_commit(_events(paused, using), using)
    for p in paused:
        logger.warning("Schedule %r paused itself until resumed: %s", p.schedule, p.reason)
    return paused


def _failed_runs(found: dict[int, Row], using: str) -> dict[int, list[tuple[int, datetime]]]:
    """The latest failed runs (id, plan time) counted for each schedule, newest first: at
    most ``NAMED`` each, in one query."""
    counted = Q()
    for pk, row in found.items():
        after = Q(plan_time__gt=row["updated_at"])
        if row["last_success"] is not None:
            after &= Q(plan_time__gt=row["last_success"])
        counted |= Q(schedule_id=pk) & after
    latest = Window(RowNumber(), partition_by=F("schedule_id"), order_by=F("plan_time").desc())
    runs = Run.objects.using(using).filter(counted, status=RunStatus.FAILED)
    runs = runs.annotate(n=latest).filter(n__lte=NAMED).order_by("schedule_id", "-plan_time")
    failed: dict[int, list[tuple[int, datetime]]] = {}
    for schedule_id, run_id, plan_time in runs.values_list("schedule_id", "pk", "plan_time"):
        failed.setdefault(schedule_id, []).append((run_id, plan_time))
    return failed


def _reason(row: Row, runs: list[tuple[int, datetime]]) -> str:
    """Why it paused itself, naming its latest failed runs: "3 failed runs in a row
    (pause_after_failures 3): run 12 planned 2026-01-01 00:02:00 UTC, ..." """
    count, limit = row["failures_since_saved"], row["pause_after_failures"]
    named = ", ".join(f"run {pk} planned {at:%Y-%m-%d %H:%M:%S} UTC" for pk, at in runs)
    more = f" and {count - len(runs)} earlier" if count > len(runs) else ""
    reason = f"{count} failed runs in a row (pause_after_failures {limit}): {named}{more}"
    return reason[: pausing.PAUSE_REASON_MAX_LENGTH]


def _events(paused: list[Paused], using: str) -> list[signals.Event]:
    return [
        (
            signals.schedule_paused,
            {
                "schedule_id": p.schedule_id,
                "schedule": p.schedule,
                "until": pausing.UNTIL_RESUMED,
                "reason": p.reason,
                "by": BY,
                "using": using,
            },
        )
        for p in paused
    ]
