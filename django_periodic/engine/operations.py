"""What the models' thin methods ask of the engine (``db.RunOperations``), loaded once by
its path (``db.OPERATIONS``), so that the models need not import the engine, which imports
them: cancelling runs, a backfill, a run outside the plan times (manual, retry), an
override applied to a planned fire's runs. The same on every database: each calls the
ledger backend of its rows' alias."""

from datetime import datetime
from typing import Any

from django_periodic.engine import overlap
from django_periodic.engine.planning import backfill as backfilling
from django_periodic.engine.planning import overrides
from django_periodic.engine.runs import leases
from django_periodic.models import FireOverride, Run, RunQuerySet, Schedule


def cancel(runs: RunQuerySet, now: datetime) -> tuple[int, int]:
    """Cancel the runs that have not started, ask the running ones to stop: (cancelled,
    asked) (``leases.request_cancel``)."""
    return leases.request_cancel(runs, now)


def override_runs(runs: RunQuerySet, override: FireOverride, now: datetime) -> int:
    """Apply an override to the runs of its fire that have not started; return how many
    (``overrides.override_runs``)."""
    return overrides.override_runs(runs, override, now)


def backfill(
    schedule: Schedule, start: datetime, end: datetime, *, rate: float | None, now: Any
) -> backfilling.BackfillResult:
    """Record a run for each plan time of ``schedule`` in ``[start, end)`` that has none
    (``planning/backfill.py``)."""
    return backfilling.backfill(schedule, start, end, rate=rate, now=now)


def plan_extra_runs(
    schedule: Schedule,
    now: datetime,
    *,
    trigger: str,
    plan_time: datetime,
    scopes: list[str],
    **snapshot: Any,
) -> list[Run]:
    """Record one extra run (manual, retry) per scope key, under its scope's overlap policy
    (``overlap.plan_extra_runs``)."""
    return overlap.plan_extra_runs(
        schedule, now, trigger=trigger, plan_time=plan_time, scopes=scopes, **snapshot
    )
