"""Pausing the schedules that keep failing (``pause_after_failures``, docs/policies.md,
"Lifecycle"): at the outcome of the failure that reaches the threshold, and, for failures
recorded otherwise, in the attention pass.

A schedule pauses itself, until resumed (``pausing.UNTIL_RESUMED``, by "scheduler"), when
its failed runs in a row reach ``pause_after_failures``: the failing rule of its alerts
(``alerting.failing``), counted from its last success, and from its last save (a resume,
an edit), so that a schedule resumed gets its threshold afresh (streaks.py). Only an
enabled schedule that no pause holds is judged (``watched``). It is judged twice over:

- ``pause_reached``: in the transaction that records failed runs (runs/outcomes.py), for
  the schedules of that batch, so that the failure that makes the streak pauses it;
- ``pause_failing``: every ``ALERT_INTERVAL``, from the facts attention.py gathers, for
  the failures no outcome recorded (a lease expired with its killed process) and the
  schedules whose row another transaction held at the outcome.

Those found are locked, skipping rows another process holds (never waiting: an outcome is
not held up by a planner's lock; the next failure or the pass pauses it), and those still
enabled and unpaused are paused in one UPDATE, their reasons naming the failed runs, each
with a version (by "scheduler"). Their fires that have not started are withdrawn: each
run waiting to start, and each claimed ahead of its plan time and not yet started (its
lease released, so that its holder does not start it), ends skipped with the code
``paused`` and the pause's note, as the planner records a fire a pause holds. Runs started
by hand, backfilled or waiting to retry are left to run. ``schedule_paused`` is sent once
the transaction commits. A few queries, only when a schedule pauses, however many.
"""

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, Value, When, Window
from django.db.models.functions import Now, RowNumber

from django_periodic import signals
from django_periodic.choices import ErrorCode, LeaseOutcome, RunStatus, RunTrigger
from django_periodic.conf import get_settings
from django_periodic.db import announcements
from django_periodic.engine import overlap
from django_periodic.engine.planning import streaks
from django_periodic.engine.runs import storable
from django_periodic.models import Lease, Run, Schedule, alerting, pausing

logger = logging.getLogger("django_periodic")

BY = "scheduler"  # paused_by of a schedule that paused itself
NAMED = 5  # the failed runs a reason names (the latest); more are counted
# What the rule reads of a schedule's row, besides its facts (attention._facts).
FACT_FIELDS = ("pause_after_failures", "updated_at", "last_success")

# A schedule's facts as attention._facts() reads them.
Row = dict[str, Any]
# The fires a pause withdraws before they start: the planner's, waiting to start.
WITHDRAWN_TRIGGER = RunTrigger.SCHEDULE
WITHDRAWN_STATUSES = (RunStatus.PENDING, RunStatus.QUEUED)


@dataclass(frozen=True)
class Paused:
    """A schedule that paused itself, and why."""

    schedule_id: int
    schedule: str
    reason: str


def watched(now: datetime | Now) -> Q:
    """The schedules judged: enabled, with ``pause_after_failures``, no pause holding them."""
    return Q(enabled=True, pause_after_failures__isnull=False) & ~pausing.paused(now)


def pause_reached(
    schedule_ids: Collection[int], now: datetime | None = None, using: str = "default"
) -> list[Paused]:
    """Pause those of these schedules whose failures in a row reach
    ``pause_after_failures``; return them. Called in the transaction that records their
    failed runs, which it counts: one query, and a few more only when one pauses. ``now``
    None means the database's clock."""
    facts = (
        Schedule.objects.using(using)
        .filter(watched(Now() if now is None else now), pk__in=schedule_ids)
        .annotate(last_success=streaks.last_success(using))
        .annotate(failures_since_saved=streaks.failures_since_saved(using), at=Now())
        .values("pk", *FACT_FIELDS, "failures_since_saved", "at")
    )
    rows = [{**row, "self_pausing": True} for row in facts]
    if not rows:
        return []
    return pause_failing(rows, rows[0]["at"] if now is None else now, using)


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
    """Pause those still unpaused and enabled once locked, withdraw their fires not
    started; announce them on commit."""
    schedules = Schedule.objects.using(using)
    # Within an outcome's transaction, no savepoint of its own: it is the outcome's.
    with transaction.atomic(using=using, savepoint=False):
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
        withdrawn = _withdraw(paused, now, using)
        announcements.send_on_commit(_events(paused, using), using)
        overlap.announce_ended(withdrawn, signals.run_skipped, using)
    for p in paused:
        logger.warning("Schedule %r paused itself until resumed: %s", p.schedule, p.reason)
    return paused


def _withdraw(paused: list[Paused], now: datetime, using: str) -> list[int]:
    """End skipped (``paused``) the fires of these schedules that have not started: those
    waiting, and those claimed ahead whose lease is not marked started (released here, so
    that the mark its holder writes before the call finds it lost). Rows another process
    holds are skipped: a claim or a mark in progress wins. Return the runs skipped."""
    fires = Run.objects.using(using).filter(
        schedule_id__in=[p.schedule_id for p in paused], trigger=WITHDRAWN_TRIGGER
    )
    waiting = fires.filter(status__in=WITHDRAWN_STATUSES).select_for_update(skip_locked=True)
    held = Lease.objects.using(using).held()
    unstarted = held.filter(started_at__isnull=True, run__in=fires.filter(status=RunStatus.RUNNING))
    unstarted = unstarted.select_for_update(skip_locked=True, of=("self",))
    leases = dict(unstarted.values_list("pk", "run_id"))
    withdrawn = [*waiting.values_list("pk", flat=True), *leases.values()]
    if not withdrawn:
        return []
    if leases:
        held.filter(pk__in=leases).release(now, LeaseOutcome.SKIPPED)
    limit = get_settings().ERROR_MAX_CHARS
    notes = Case(
        *(
            When(schedule_id=p.schedule_id, then=Value(storable.storable_text(_note(p), limit)))
            for p in paused
        )
    )
    Run.objects.using(using).filter(pk__in=withdrawn).update(
        status=RunStatus.SKIPPED,
        error_code=ErrorCode.PAUSED,
        error_message=notes,
        next_retry_at=None,
        started_at=None,
        finished_at=now,
    )
    return withdrawn


def _note(paused: Paused) -> str:
    """A withdrawn fire's message: the pause's note, as the planner writes it for a fire a
    pause holds (decisions.py), which explain() reads back."""
    return pausing.pause_note(pausing.UNTIL_RESUMED, paused.reason, BY)


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
