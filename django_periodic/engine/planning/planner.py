"""Planning: due schedules become runs, exactly once per plan time.

One tick locks a batch of due schedules (skipping rows another planner holds), decides
in Python what each fires, advances every cursor by compare-and-set and inserts the runs,
all in one transaction and a constant number of queries however many schedules are due.

Deciding costs Python time per schedule, so a batch reads only the columns a decision needs
and computes each distinct trigger's fire times once: many schedules sharing a trigger and a
cursor (100,000 on the same cron) cost one ``next_after``, not one each.

A fanned-out schedule (``Schedule.scopes``) records one run per scope key. Its provider is
app code that may query or call out, so it is never called while rows are locked: the batch
that finds it due leaves it alone, its provider is called after that transaction, and a
second one locks it again and records the runs of every key, unless another planner has
planned that fire meanwhile.

Whatever a row holds, it fails alone: any exception while deciding for a schedule, or
loading it, is recorded on that schedule (``recording.record_failure``) and the rest of the
batch is planned. A schedule stored without save() has the cursor ``bounds.UNPLANNED``: the
batch that finds it sets its first fire time, as save() would have, and records no run.
"""

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Q, When

from django_periodic import policies, scopes, signals
from django_periodic.conf import get_settings
from django_periodic.db import CONNECTION_ERRORS, announcements, timestamps
from django_periodic.engine import batches, fleet, overlap, records
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import overrides, recording
from django_periodic.engine.planning.decisions import (
    Memo,
    decide_all,
    decide_fanned_out,
    first_planned,
)
from django_periodic.engine.records import Decision, Due, PlanResult
from django_periodic.error_texts import error_text
from django_periodic.models import Calendar, Run, Schedule, ScheduleQuerySet
from django_periodic.models.calendars import RULE_FIELDS, closures_from
from django_periodic.models.trigger_rows import ANCHORED_AT_CREATION
from django_periodic.policies import Occupancy
from django_periodic.timing import bounds
from django_periodic.timing.business_days import Closures

logger = logging.getLogger("django_periodic")

DECISION_FIELDS = (
    "pk", "name", "job", "cron", "timezone", "interval", "run_at", "start_at", "end_at",
    "anchor", "next_fire_at", "overlap", "max_queued", "max_concurrent", "misfire",
    "misfire_grace", "planning_failures", "scopes", "paused_until", "pause_reason", "paused_by",
    "dst_gap", "dst_repeat", "on_closed_day", "has_calendars", "jitter", "job_unknown_since",
    "max_runs", "fire_count", "has_overrides", "rrule", "finish_within",
)  # fmt: skip


def plan_due(
    now: datetime,
    *,
    using: str = "default",
    batch_size: int | None = None,
    ahead: timedelta = timedelta(0),
) -> PlanResult:
    """Turn every fire due at ``now`` of one batch of schedules into runs.

    With ``ahead``, a schedule whose next fire comes within ``ahead`` of ``now`` and that has
    nothing in flight is planned already (pending, for that plan time), so that it can be
    claimed and start on time. One with a run in flight is left to be planned when due:
    its overlap policy must decide on what is in flight then.
    """
    batch_size = batch_size or get_settings().PLAN_BATCH_SIZE
    with transaction.atomic(using=using):
        due = _without_waiting(Schedule.objects.using(using).due(now + ahead), now)
        schedules, unloadable = _locked(due, batch_size, using)
        if not schedules and not unloadable:
            return PlanResult()
        disabled = fleet.judge_jobs(schedules, now, using)
        schedules = _without(schedules, disabled)
        memo = Memo()
        unplanned = [first_planned(s, now, memo) for s in schedules if _unplanned(s)]
        schedules = [s for s in schedules if not _unplanned(s)]
        occupancy = overlap.occupancy(Run.objects.using(using), [s.pk for s in schedules])
        fanned_out = [s for s in schedules if s.scopes]
        if fanned_out:
            schedules = [s for s in schedules if not s.scopes]
        decisions = decide_all(schedules, now, occupancy, memo)
        result = _apply([*unloadable, *unplanned, *decisions], now, using)
        result += _disabled_for_jobs(disabled, using)
    # Outside the transaction: the providers of those that can be planned now are called next.
    plannable = [s for s in fanned_out if not _waits_for_due_time(s, now, occupancy)]
    if plannable:
        result += _plan_fanned_out(plannable, now, ahead, using)
    return result


def _without(schedules: list[Due], left_out: list[Due]) -> list[Due]:
    if not left_out:
        return schedules
    pks = {s.pk for s in left_out}
    return [s for s in schedules if s.pk not in pks]


def _disabled_for_jobs(disabled: list[Due], using: str) -> PlanResult:
    """The result of disabling schedules whose job no live process has (``fleet.py``)."""
    if not disabled:
        return PlanResult()
    decisions = [Decision(s, cursor=None, error=fleet.grace_error(s.job)) for s in disabled]
    if signals.listened(signals.schedule_disabled):
        announcements.send_on_commit(_disabled_events(decisions, using), using)
    names = [s.name for s in disabled]
    return PlanResult(schedules=len(disabled), failed=names, disabled=list(names))


def _without_waiting(due: ScheduleQuerySet, now: datetime) -> ScheduleQuerySet:
    """These schedules without those whose fire within the lead waits to be planned when
    due because a run of theirs is in flight (``_waits_for_due_time``'s rule, as a
    filter): a pass made while a burst of runs is in flight neither locks nor loads them,
    and so takes no time from the burst. The rule in Python stays the judge of what is
    loaded (a run may start in flight between this statement and the next).

    Those it leaves are not counted: the scheduler sees them in its look-ahead, still
    unplanned. A count of them, on every pass, took 1-2 s of the loop after an autovacuum
    mid-burst (measured on the 1,000 x 1 s lag workload), and stalled every burst after."""
    runs = Run.objects.filter(schedule_id=OuterRef("pk"), status__in=Run.ACTIVE_STATUSES)
    waits = Q(next_fire_at__gt=now) & Exists(runs)
    return due.filter(~waits)


def _locked(due: ScheduleQuerySet, limit: int, using: str) -> tuple[list[Due], list[Decision]]:
    """Lock up to ``limit`` of these schedules, skipping those another planner holds, and
    load the columns planning reads.

    Also returns the failures of rows that cannot be loaded (a value Python cannot hold,
    stored past the database's checks): found one by one, only when the batch fails.
    """
    fields = DECISION_FIELDS + ledger(using).SNAPSHOT_COLUMNS_LOADED
    due = due.select_for_update(skip_locked=True)
    # Loading a timestamp costs microseconds: created_at only where it anchors an interval.
    due = due.annotate(anchor=Case(When(ANCHORED_AT_CREATION, then=F("created_at"))))
    # Whether it has calendars: an index probe per row, so that those without cost nothing.
    calendars = Schedule.calendars.through.objects.filter(schedule_id=OuterRef("pk"))
    due = due.annotate(has_calendars=Exists(calendars), has_overrides=overrides.HAS_OVERRIDES)
    loaded, failed = batches.else_one_by_one(
        partial(_load, due, limit, fields, using),
        partial(_load_one_by_one, due, limit, fields),
        "Could not load a batch of due schedules; loading them one at a time.",
    )
    _load_calendars([s for s in loaded if s.has_calendars], using)
    overrides.load([s for s in loaded if s.has_overrides], using)
    return loaded, failed


def _load_calendars(schedules: list[Due], using: str) -> None:
    """Give these schedules their calendars, in two queries (which calendars, then each of
    them once); each distinct set's rules are built once. A calendar that cannot be used
    fails the schedules using it (``Due.calendar_error``), never the batch."""
    if not schedules:
        return
    links = Schedule.calendars.through.objects.using(using)
    links = links.filter(schedule_id__in=[s.pk for s in schedules])
    try:
        pairs = list(links.values_list("schedule_id", "calendar_id"))
        # Each calendar once, however many schedules use it (its JSON parsed once).
        calendars = Calendar.objects.using(using).filter(pk__in={c for _, c in pairs})
        values = {row[0]: row[1:] for row in calendars.values_list("pk", *RULE_FIELDS)}
    except CONNECTION_ERRORS:
        raise
    except Exception as exc:
        for schedule in schedules:
            schedule.calendar_error = f"Its calendars cannot be loaded ({error_text(exc)})."
        return
    pairs = [pair for pair in pairs if pair[1] in values]  # not deleted in between
    calendar_ids: dict[int, list[int]] = {}
    for schedule_id, calendar_id in sorted(pairs, key=lambda pair: str(values[pair[1]][0])):
        calendar_ids.setdefault(schedule_id, []).append(calendar_id)  # by calendar name
    built: dict[tuple[int, ...], Closures | str | None] = {}
    for schedule in schedules:
        ids = tuple(calendar_ids.get(schedule.pk, ()))
        if ids not in built:
            built[ids] = _closures(values[i] for i in ids)
        closures = built[ids]
        if isinstance(closures, str):
            schedule.calendar_error = closures
        else:
            schedule.closures = closures


def _closures(calendars: Iterable[tuple[object, ...]]) -> Closures | str | None:
    try:
        return closures_from(calendars)
    except Exception as exc:
        return str(exc)


def _load(
    due: ScheduleQuerySet, limit: int, fields: tuple[str, ...], using: str
) -> tuple[list[Due], list[Decision]]:
    with timestamps.timestamps_parsed_once(using):
        return [Due(*row) for row in due.values_list(*fields)[:limit]], []


def _load_one_by_one(
    due: ScheduleQuerySet, limit: int, fields: tuple[str, ...]
) -> tuple[list[Due], list[Decision]]:
    loaded: list[Due] = []
    failed: list[Decision] = []
    for pk, name, failures in due.values_list("pk", "name", "planning_failures")[:limit]:
        row = batches.refusal(due.filter(pk=pk).values_list(*fields).get)
        if isinstance(row, Exception):
            error = (
                f"Cannot plan: its row cannot be loaded ({type(row).__name__}: {error_text(row)})."
            )
            failed.append(Decision(_unloadable(pk, name, failures), cursor=None, error=error))
        else:
            loaded.append(Due(*row))
    return loaded, failed


def _unloadable(pk: int, name: str, planning_failures: int) -> Due:
    """A schedule whose row cannot be loaded: what recording its failure reads, no more."""
    return Due(
        pk=pk, name=name, job="", cron="", timezone="", interval=None, run_at=None,
        start_at=None, end_at=None, created_at=None, next_fire_at=None, overlap="",
        max_queued=0, max_concurrent=None, misfire="", misfire_grace=timedelta(0),
        planning_failures=planning_failures, scopes="",
    )  # fmt: skip


def _unplanned(schedule: Due) -> bool:
    """Stored without save(): its cursor is the database's default, not a fire time."""
    return schedule.next_fire_at == bounds.UNPLANNED


def _waits_for_due_time(
    schedule: Due, now: datetime, occupancy: dict[tuple[int, str], Occupancy]
) -> bool:
    """Whether a fire within the lead waits to be planned when due: a run of the schedule
    (of any scope) is in flight, and the overlap policy must decide on what is then."""
    ahead = schedule.next_fire_at is not None and schedule.next_fire_at > now
    return ahead and any(pk == schedule.pk for pk, _scope in occupancy)


def _plan_fanned_out(seen: list[Due], now: datetime, ahead: timedelta, using: str) -> PlanResult:
    """Plan the next fire(s) of fanned-out schedules: one run per scope key.

    Each provider is called once here, outside any transaction; then the schedules are
    locked again, and one whose cursor or provider changed meanwhile (another planner
    planned it, someone edited it) is left alone, its keys unused. A provider that fails
    fails its schedule's planning like any bad row: nothing recorded, the cursor kept.
    """
    keys: dict[int, list[str] | str] = {}
    for schedule in seen:
        try:
            keys[schedule.pk] = scopes.scope_keys(schedule.scopes)
        except Exception as exc:  # app code: one provider fails its schedule, never the tick
            keys[schedule.pk] = (
                f"Cannot plan: scope provider {schedule.scopes!r} failed: {error_text(exc)}"
            )
    expected = {s.pk: (s.next_fire_at, s.scopes) for s in seen}
    with transaction.atomic(using=using):
        due = Schedule.objects.using(using).due(now + ahead).filter(pk__in=expected)
        schedules, unloadable = _locked(due, len(seen), using)
        locked = [
            schedule
            for schedule in schedules
            if expected[schedule.pk] == (schedule.next_fire_at, schedule.scopes)
        ]
        occupancy = overlap.occupancy(Run.objects.using(using), [s.pk for s in locked])
        memo = Memo()
        decisions = unloadable
        for schedule in locked:
            fetched = keys[schedule.pk]
            if isinstance(fetched, str):
                decisions.append(Decision(schedule, cursor=None, error=fetched))
            elif not _waits_for_due_time(schedule, now, occupancy):
                decisions.append(decide_fanned_out(schedule, now, fetched, occupancy, memo))
        return _apply(decisions, now, using)


def _apply(decisions: list[Decision], now: datetime, using: str) -> PlanResult:
    result = PlanResult(schedules=len(decisions))
    failed = [d for d in decisions if d.error]
    listened = signals.listened(signals.run_planned, signals.run_skipped)
    inserted: list[records.PlannedRow] | None = [] if listened else None
    planned, refused = recording.record([d for d in decisions if not d.error], now, using, inserted)
    failed += refused
    disabled: list[Decision] = []
    for decision in failed:
        if recording.record_failure(decision.schedule, decision.error, using):
            result.disabled.append(decision.schedule.name)
            disabled.append(decision)
        result.failed.append(decision.schedule.name)
    if inserted:
        names = {d.schedule.pk: d.schedule.name for d in decisions}
        announcements.send_on_commit(recording.planned_events(inserted, names, using), using)
    if disabled and signals.listened(signals.schedule_disabled):
        announcements.send_on_commit(_disabled_events(disabled, using), using)
    fires = [(d.schedule, fire) for d in planned for fire in d.fires]
    result.skipped = sum(fire.status == Run.Status.SKIPPED for _, fire in fires)
    result.fired = len(fires) - result.skipped
    result.late = sum(
        fire.status != Run.Status.SKIPPED
        and (fire.release_at or fire.plan_time)
        < policies.misfire_deadline(schedule.misfire_grace, now)
        for schedule, fire in fires
    )
    return result


def _disabled_events(disabled: list[Decision], using: str) -> list[signals.Event]:
    return [
        (
            signals.schedule_disabled,
            {
                "schedule_id": d.schedule.pk,
                "schedule": d.schedule.name,
                "error": d.error,
                "using": using,
            },
        )
        for d in disabled
    ]
