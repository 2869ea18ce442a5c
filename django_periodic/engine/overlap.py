"""The overlap policy on the ledger: what each (schedule, scope) has in flight, the runs
recorded outside the trigger's plan times under it (manual, retry), the waiting retries a
newer fire supersedes, the queued run promoted when its scope frees up, and the signals
of runs ended without running (``announce_ended``), which make way for a queued one.

The decisions themselves are pure (``policies``); this module feeds them the rows and
writes what they decide.
"""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Window
from django.db.models.functions import RowNumber
from django.dispatch import Signal

from django_periodic import policies, signals
from django_periodic.choices import ErrorCode
from django_periodic.db import announcements
from django_periodic.engine.backends import ledger
from django_periodic.models import Run, RunQuerySet, Schedule
from django_periodic.models.run import BACKFILLED
from django_periodic.timing import bounds

SUPERSEDED_MESSAGE = "A newer fire of its schedule replaced it before it was retried."


def occupancy(
    runs: RunQuerySet, schedule_ids: list[int]
) -> dict[tuple[int, str], policies.Occupancy]:
    """What each (schedule, scope) of these schedules has in flight, for the overlap
    policy (one query). An unscoped schedule's runs have the scope ""."""
    active = Q(status__in=[Run.Status.PENDING, Run.Status.RUNNING])
    rows = (
        runs.filter(ledger(runs.db).of_schedules(schedule_ids), status__in=Run.ACTIVE_STATUSES)
        .values("schedule_id", "scope")
        .annotate(
            active=Count("pk", filter=active),
            queued=Count("pk", filter=Q(status=Run.Status.QUEUED)),
            retrying=Count("pk", filter=Q(status=Run.Status.RETRYING) & ~BACKFILLED),
        )
        .order_by()
    )
    return {
        (row["schedule_id"], row["scope"]): policies.Occupancy(
            row["active"], row["queued"], row["retrying"] > 0
        )
        for row in rows
    }


def supersede_retries(runs: RunQuerySet, now: datetime) -> int:
    """End these runs' waiting retries ``failed``: a newer fire of their schedule replaced
    them (``policies.supersedes_retry``). Backfilled runs waiting for their release are
    not retries."""
    retries = runs.filter(status=Run.Status.RETRYING).exclude(BACKFILLED)
    return retries.update(
        status=Run.Status.FAILED,
        error_code=ErrorCode.SUPERSEDED,
        error_message=SUPERSEDED_MESSAGE,
        next_retry_at=None,
        finished_at=now,
    )


def promote_queued(using: str, schedule_ids: Iterable[int] | None) -> int:
    """Make the oldest queued run of each (schedule, scope) of these schedules pending
    once that scope has no active run.

    ``None`` means every schedule: the sweeper's pass for runs a crash left queued.
    """
    if schedule_ids is not None:
        schedule_ids = list(schedule_ids)
        if not schedule_ids:
            return 0  # most outcomes: no queue to move, and no query to build
    runs = Run.objects.using(using)
    queued = runs.filter(status=Run.Status.QUEUED)
    if schedule_ids is not None:
        queued = queued.filter(schedule_id__in=schedule_ids)
    # The oldest queued run of each scope, ranked in one pass over the queued runs: a
    # subquery per queued run was estimated so dear on stale statistics that PostgreSQL
    # compiled it (JIT), 0.3-0.8 s each time.
    in_scope = Window(
        RowNumber(),
        partition_by=[F("schedule_id"), F("scope")],
        order_by=[F("plan_time"), F("pk")],
    )
    oldest = queued.annotate(place=in_scope).filter(place=1).values("pk")
    same_scope = {"schedule_id": OuterRef("schedule_id"), "scope": OuterRef("scope")}
    holding = runs.filter(**same_scope, exclusive=True, status__in=Run.SLOT_STATUSES)
    # Queued still when updated: another process may have moved it meanwhile.
    candidates = runs.filter(pk__in=oldest, status=Run.Status.QUEUED).filter(~Exists(holding))
    try:
        with transaction.atomic(using=using):
            promoted = candidates.update(status=Run.Status.PENDING)
    except IntegrityError:
        return 0  # another process promoted a run of the same scope first: it starts
    if promoted:
        announcements.notify(using)
    return promoted


def plan_extra_runs(
    schedule: Schedule,
    now: datetime,
    *,
    trigger: str,
    plan_time: datetime,
    scopes: list[str],
    **snapshot: Any,
) -> list[Run]:
    """Record one extra run (manual, retry) per scope key, each under its scope's overlap
    policy. ``snapshot`` may override the job name, arguments and revision (a retry
    repeats what the failed run called).

    The decisions are taken on the schedule row as locked now (the planner holds the
    same lock while it decides), never on the instance given, which may be stale. Raises
    ValidationError, recording nothing, for a ``finish_within`` out of its range.
    """
    using = schedule._state.db or "default"
    with transaction.atomic(using=using):
        locked = Schedule.objects.using(using).select_for_update().get(pk=schedule.pk)
        _refuse_bad_deadline(locked)
        runs = Run.objects.using(using)
        in_flight_by_scope = occupancy(runs, [locked.pk])
        new, superseding = [], []
        for scope in scopes:
            in_flight = in_flight_by_scope.get((locked.pk, scope), policies.Occupancy())
            status, reason = policies.overlap_status(locked, in_flight)
            if policies.supersedes_retry(in_flight, [status]):
                superseding.append(scope)
            new.append(_extra_run(locked, now, plan_time, scope, trigger, status, reason, snapshot))
        if superseding:
            supersede_retries(runs.filter(schedule=locked, scope__in=superseding), now)
        created = runs.bulk_create(new)
        if any(run.status == Run.Status.PENDING for run in created):
            announcements.notify(using)
        if signals.listened(signals.run_planned, signals.run_skipped):
            announcements.send_on_commit(map(signals.recorded, created), using)
    return created


def _refuse_bad_deadline(schedule: Schedule) -> None:
    """Refuse a run of a schedule whose ``finish_within`` was stored out of its range (past
    its CHECK): its deadline cannot be worked out. As ``full_clean()`` would, on the field,
    with its range, for whoever asked (the admin shows it)."""
    out_of_range = bounds.SCHEDULE["finish_within"].error("finish_within", schedule.finish_within)
    if out_of_range:
        raise ValidationError({"finish_within": out_of_range})


def _extra_run(
    schedule: Schedule,
    now: datetime,
    plan_time: datetime,
    scope: str,
    trigger: str,
    status: str,
    reason: str,
    snapshot: dict[str, Any],
) -> Run:
    # A retry repeats an old plan time: its deadline counts from now, or it would be late
    # as it is recorded. A run recorded skipped is finished already: it has none.
    skipped = status == Run.Status.SKIPPED
    finish_by = None if skipped else policies.finish_by(max(plan_time, now), schedule.finish_within)
    run = Run.for_schedule(
        schedule,
        plan_time,
        trigger=trigger,
        status=status,
        error_code=reason,
        finish_by=finish_by,
        **snapshot,
    )
    run.scope, run.created_at = scope, now
    if status == Run.Status.SKIPPED:
        run.finished_at = now
    return run


def announce_ended(run_ids: list[int], signal: Signal, using: str, **extra: Any) -> None:
    """``signal`` for runs a claim ended without running them: ``run_skipped`` for those
    past their start deadline, ``run_finished`` for those it failed (rare: one query)."""
    if run_ids and signals.listened(signal):
        ended = Run.objects.using(using).filter(pk__in=run_ids).select_related("schedule")
        announcements.send_on_commit((signals.of_run(signal, r, **extra) for r in ended), using)
