"""Recording what planning decided: cursors moved by compare-and-set, runs inserted.

A batch is recorded in one savepoint of the planner's transaction: every cursor moves from
the value read to its new one, and only schedules whose cursor moved get their runs. On
PostgreSQL that is one statement whatever the batch size; elsewhere the ORM does it. If the
database refuses a batch (a run breaking one-active-run, a value out of its range), or
preparing it raises, the schedules are recorded one at a time, so one bad row fails alone.

A schedule ends after its ``max_runs`` fires (docs/policies.md, "Lifecycle"). Its
``fire_count`` counts its fires planned to run: the distinct plan times of a decision
recorded pending or queued (a fanned-out fire counts once, however many scopes; a fire
recorded skipped does not count, nor does a manual run or a backfill), worked out here
(``counted``) and added by the statement that moves its cursor. A decision that would
reach ``max_runs`` is cut at the fire that reaches it (``capped``): no fire after it is recorded
(a misfire ``all`` catch-up cannot overshoot) and the cursor becomes NULL, so the
schedule has no next fire until ``max_runs`` is raised or cleared (``Schedule.save()``).
"""

import logging
from dataclasses import replace
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import Q

from django_periodic import policies, signals
from django_periodic.choices import RunStatus
from django_periodic.conf import get_settings
from django_periodic.engine import batches, overlap
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import Decision, Due, Fire, FireRow, PlannedRow, Recorded
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped
from django_periodic.models import Run, Schedule
from django_periodic.models.schedule_fields import runs_left
from django_periodic.timing import stagger

logger = logging.getLogger("django_periodic")


def record(
    decisions: list[Decision],
    now: datetime,
    using: str,
    inserted: list[PlannedRow] | None = None,
) -> tuple[list[Decision], list[Decision]]:
    """Record a batch; return the decisions applied and those the database refused.

    The schedules' rows must be locked by the current transaction since their cursors were
    read (``plan_due`` selects them ``FOR UPDATE``). A refused decision carries the
    database's error; its schedule's cursor has not moved. With ``inserted``, the runs
    inserted are added to that list (for the signals; it costs a RETURNING). A decision
    that reaches its schedule's ``max_runs`` is recorded cut there (``capped``).
    """
    decisions = [capped(d) if d.schedule.max_runs else d for d in decisions]
    return batches.else_one_by_one(
        lambda: (_record_atomically(decisions, now, using, inserted), []),
        lambda: _record_one_by_one(decisions, now, using, inserted),
        "Planning a batch failed; planning its schedules one at a time.",
    )


def _record_atomically(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    """Record in one savepoint; the runs inserted join ``inserted`` once it is released."""
    found: list[PlannedRow] | None = None if inserted is None else []
    with transaction.atomic(using=using):
        planned = _record(decisions, now, using, found)
    if inserted is not None and found:
        inserted += found
    return planned


def _record(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> list[Decision]:
    """End the retries the new fires supersede, then advance the cursors and insert the runs;
    return the decisions applied."""
    if not decisions:
        return []
    # A retry this batch supersedes ends first: it holds the active slot the new run takes.
    supersede_retries(decisions, now, using)
    seen: Seen = {}
    return ledger(using).record_fires([recorded(d, now, seen) for d in decisions], now, inserted)


# What recorded() worked out for the fires of a batch, by (fires, grace, deadline).
Seen = dict[tuple[int, object, object], tuple[int, tuple[FireRow, ...]]]


def recorded(decision: Decision, now: datetime, seen: Seen) -> Recorded:
    """A decision with what its statement writes: the fires ``fire_count`` counts, each run's
    release, start deadline and deadline to finish (raises ValueError for a schedule whose
    ``finish_within`` is out of its range: it fails alone).

    ``seen`` shares that work between the decisions of a batch that fire alike: schedules
    sharing a trigger and a cursor share their fires (``decisions.Memo``), and without a
    stagger their rows depend on nothing else but their grace and deadline."""
    schedule = decision.schedule
    key = (id(decision.fires), schedule.misfire_grace, schedule.finish_within)
    if schedule.jitter:  # its releases are its own
        return Recorded(decision, *_fire_rows(decision, now))
    if key not in seen:
        seen[key] = _fire_rows(decision, now)
    return Recorded(decision, *seen[key])


def _fire_rows(decision: Decision, now: datetime) -> tuple[int, tuple[FireRow, ...]]:
    schedule = decision.schedule
    rows = []
    for fire in decision.fires:
        released = release(schedule, fire)
        deadline = start_deadline(schedule, fire, released, now)
        rows.append((fire, released, deadline, finish_by(schedule, fire)))
    return counted(decision.fires), tuple(rows)


def planned_events(
    inserted: list[PlannedRow], names: dict[int, str], using: str
) -> list[signals.Event]:
    """The signals of runs just recorded (``run_planned``, or ``run_skipped`` for those
    recorded skipped); ``names`` maps their schedules' ids to their names."""
    return [
        signals.run_event(
            signals.run_skipped if status == Run.Status.SKIPPED else signals.run_planned,
            run_id=run_id,
            schedule_id=schedule_id,
            schedule=names[schedule_id],
            scope=scope,
            plan_time=plan_time,
            attempt=0,
            status=status,
            reason=reason,
            using=using,
        )
        for run_id, schedule_id, scope, plan_time, status, reason in inserted
    ]


def supersede_retries(decisions: list[Decision], now: datetime, using: str) -> None:
    """End the waiting retries that new fires supersede, scope by scope."""
    superseding = [d for d in decisions if d.supersedes]
    if not superseding:
        return
    unscoped = [d.schedule.pk for d in superseding if d.supersedes == ("",)]
    retries = Q(schedule_id__in=unscoped, scope="")
    for decision in superseding:
        if decision.supersedes != ("",):
            retries |= Q(schedule_id=decision.schedule.pk, scope__in=decision.supersedes)
    overlap.supersede_retries(Run.objects.using(using).filter(retries), now)


def _record_one_by_one(
    decisions: list[Decision], now: datetime, using: str, inserted: list[PlannedRow] | None
) -> tuple[list[Decision], list[Decision]]:
    planned: list[Decision] = []
    failed: list[Decision] = []
    for decision in decisions:
        result = batches.refusal(partial(_record_atomically, [decision], now, using, inserted))
        if isinstance(result, Exception):
            decision.error = f"Cannot plan: {type(result).__name__}: {error_text(result)}"
            failed.append(decision)
        else:
            planned += result
    return planned, failed


def record_failure(schedule: Due, error: str, using: str) -> bool:
    """Note why a schedule could not be planned; disable it after repeated failures.

    Returns whether it was disabled. The cursor stays, so a fixed row fires from where it
    stopped (its misfire policy decides about the times missed meanwhile).
    """
    limit = get_settings().PLANNING_FAILURE_LIMIT
    # Counted up to the limit only: a count stored past it must not overflow the column.
    failures = min(schedule.planning_failures, limit - 1) + 1
    disable = failures >= limit
    fields = {"planning_failures": failures, "last_error": error}
    if disable:
        fields["enabled"] = False
        logger.error(
            "Disabled schedule %r after %d failures: %s", schedule.name, failures, escaped(error)
        )
    else:
        logger.error("Could not plan schedule %r: %s", schedule.name, escaped(error))
    Schedule.objects.using(using).filter(pk=schedule.pk).update(**fields)
    return disable


def release(schedule: Due, fire: Fire) -> datetime | None:
    """When a fire's run may start: a moved fire's new time, else after its stagger."""
    if fire.release_at is not None:
        return fire.release_at
    return stagger.release_time(schedule.jitter, schedule.pk, fire.scope, fire.plan_time)


def start_deadline(
    schedule: Due, fire: Fire, release: datetime | None, now: datetime
) -> datetime | None:
    """A pending run's deadline, counted from its release (a stagger delays its start)."""
    if fire.status != Run.Status.PENDING:
        return None
    return policies.start_deadline(schedule.misfire_grace, release or fire.plan_time, now)


def finish_by(schedule: Due, fire: Fire) -> datetime | None:
    """A fire's deadline to finish, from its plan time; none for a fire recorded skipped
    (it is finished as it is recorded)."""
    if fire.status == Run.Status.SKIPPED:
        return None
    return policies.finish_by(fire.plan_time, schedule.finish_within)


def counted(fires: tuple[Fire, ...]) -> int:
    """How many fires of a decision ``fire_count`` counts: its plan times that run."""
    return len({fire.plan_time for fire in fires if fire.status != RunStatus.SKIPPED})


def capped(decision: Decision) -> Decision:
    """The decision, cut at the fire that reaches its schedule's ``max_runs``."""
    schedule = decision.schedule
    left = runs_left(schedule.max_runs, schedule.fire_count)
    if left is None or decision.error:
        return decision
    if left == 0:  # ended already (max_runs lowered without save(), say): nothing fires
        return replace(decision, cursor=None, fires=(), supersedes=())
    running = sorted({f.plan_time for f in decision.fires if f.status != RunStatus.SKIPPED})
    if len(running) < left:
        return decision
    last = running[left - 1]
    fires = tuple(fire for fire in decision.fires if fire.plan_time <= last)
    return replace(decision, cursor=None, fires=fires)
