"""The runs a schedule records on request, besides those the planner records as it fires:
a manual run (``run_now()``, ``run_now_for_all_scopes()``), a backfill of past plan times
(``backfill()``), any extra run under the overlap policy (``plan_extra_run()``, a retry's).
Each is a thin method of ``Schedule`` that calls the engine, defined here and set on the
class under its name.
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_periodic import choices, db
from django_periodic import scopes as scope_providers
from django_periodic.db import clock

if TYPE_CHECKING:
    from django_periodic.models.run import Run
    from django_periodic.models.schedule import Schedule


def run_now(schedule: "Schedule", scope: str = "") -> "Run":
    """Record a manual run for a scheduler to execute; never runs the job in this thread.

    On a fanned-out schedule (``scopes`` set), ``scope`` names the scope key to run for;
    ``run_now_for_all_scopes()`` runs every key the provider returns.
    """
    if schedule.scopes and not scope:
        raise ValueError(
            f"Schedule {schedule.name!r} is fanned out per scope ({schedule.scopes}): name the "
            "scope key to run for, or run all of them (run_now_for_all_scopes())."
        )
    now = clock.now(schedule._state.db or "default")
    return schedule.plan_extra_run(
        now, trigger=choices.RunTrigger.MANUAL, plan_time=now, scope=scope
    )


def run_now_for_all_scopes(schedule: "Schedule") -> list["Run"]:
    """Record manual runs as a fire would: one per scope key of a fanned-out schedule
    (its provider is called here, before any row is locked), else ``run_now()``'s one."""
    if not schedule.scopes:
        return [schedule.run_now()]
    keys = scope_providers.scope_keys(schedule.scopes)
    now = clock.now(schedule._state.db or "default")
    return schedule.plan_extra_runs(
        now, trigger=choices.RunTrigger.MANUAL, plan_time=now, scopes=keys
    )


def backfill(
    schedule: "Schedule",
    start: datetime,
    end: datetime,
    *,
    rate: float | None = None,
    now: datetime | None = None,
) -> Any:
    """Record a run (trigger ``backfill``) for each plan time of the trigger in
    ``[start, end)`` that has no run yet, one per scope key on a fanned-out schedule.

    Only past plan times are recorded (``end`` is clamped to the database's clock);
    the cursor does not move. Runs wait until released ``rate`` per second (default
    ``DEFAULT_RATE`` of ``engine/planning/backfill.py``), after the schedule's runs already
    waiting from an earlier backfill. Raises ValueError for a bad range, or more than
    ``MAX_RUNS`` runs. See docs/backfill.md.
    """
    using = schedule._state.db or "default"
    return db.ledger(using).backfill(schedule, start, end, rate=rate, now=now)


def plan_extra_run(
    schedule: "Schedule",
    now: datetime,
    *,
    trigger: str,
    plan_time: datetime,
    scope: str = "",
    **snapshot: Any,
) -> "Run":
    """Record a run outside the trigger's plan times (manual, retry) under the overlap
    policy of its scope, like any fire. ``snapshot`` may override the job name,
    arguments and revision (a retry repeats what the failed run called).
    """
    runs = schedule.plan_extra_runs(
        now, trigger=trigger, plan_time=plan_time, scopes=[scope], **snapshot
    )
    return runs[0]


def plan_extra_runs(
    schedule: "Schedule",
    now: datetime,
    *,
    trigger: str,
    plan_time: datetime,
    scopes: list[str],
    **snapshot: Any,
) -> list["Run"]:
    """Record one extra run per scope key, each under its scope's overlap policy, as a
    fire would (the engine's ``overlap.plan_extra_runs``)."""
    using = schedule._state.db or "default"
    runs: list[Run] = db.ledger(using).plan_extra_runs(
        schedule, now, trigger=trigger, plan_time=plan_time, scopes=scopes, **snapshot
    )
    return runs
