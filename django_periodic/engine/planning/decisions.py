"""Deciding what due schedules fire, without the database, and what the decisions carry.

The planner loads due rows (``planned.Due``) and applies the decisions (``Decision``:
the runs to record, ``Fire``, and where the cursor moves); ``decide`` and its kin take
them from the rows alone, by the misfire and overlap policies (``policies``), each
distinct trigger's fire times computed once per batch (``Memo``). Whatever a row holds,
deciding for it fails alone: its decision carries the error. The recording module writes
decisions without importing the planner.
"""

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django_periodic import policies
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.conf import get_settings
from django_periodic.engine.records import Decision, Due, Fire
from django_periodic.engine.runs import storable
from django_periodic.models.pausing import pause_note
from django_periodic.models.trigger_rows import first_fire_time_of
from django_periodic.policies import Occupancy
from django_periodic.timing import open_fires, overridden, triggers

logger = logging.getLogger("django_periodic")


@dataclass
class DueTimes:
    times: list[datetime]  # plan times up to now, in order: at most CATCHUP_LIMIT + 2
    cursor: datetime | None  # the first fire after now
    unlisted: datetime | None = None  # the first of the missed times not listed one by one


def first_planned(schedule: Due, now: datetime, memo: "Memo | None" = None) -> Decision:
    """The decision for a schedule stored without save() (cursor ``bounds.UNPLANNED``): its
    cursor moves to its first fire time, as save() would have set it, and no run is
    recorded for the time it never had (no database access).

    Like ``Schedule.first_fire_time``, a one-shot keeps its ``run_at`` even when it has
    passed, so that its misfire policy decides when the next batch plans it.
    """
    memo = memo or Memo()
    try:
        return Decision(schedule, cursor=memo.first_fire_time(schedule, now))
    except Exception as exc:  # a bad trigger: this schedule fails, never the tick
        return _failed(schedule, exc)


def decide_fanned_out(
    schedule: Due,
    now: datetime,
    keys: list[str],
    occupancy: dict[tuple[int, str], Occupancy],
    memo: "Memo | None" = None,
) -> Decision:
    """A fanned-out schedule's decision: its fires once per scope key, each under the overlap
    policy of that scope's runs in flight (no database access).

    No key, no run; the cursor moves all the same.
    """
    memo = memo or Memo()
    try:
        return _decide_fanned_out(schedule, now, keys, occupancy, memo)
    except Exception as exc:  # any bad row: one schedule fails, never the tick
        return _failed(schedule, exc)


def _decide_fanned_out(
    schedule: Due,
    now: datetime,
    keys: list[str],
    occupancy: dict[tuple[int, str], Occupancy],
    memo: "Memo",
) -> Decision:
    ahead = schedule.next_fire_at is not None and schedule.next_fire_at > now
    at = schedule.next_fire_at if ahead else now
    assert at is not None  # a due schedule has a cursor
    idle = decide(schedule, at, Occupancy(), memo)  # every scope with nothing in flight
    if idle.error:
        return idle
    fires: list[Fire] = []
    supersedes = []
    for key in keys:
        in_flight = occupancy.get((schedule.pk, key))
        decided = idle if in_flight is None else decide(schedule, at, in_flight, memo)
        if decided.supersedes:
            supersedes.append(key)
        fires += [replace(fire, scope=key) for fire in decided.fires]
    return Decision(schedule, idle.cursor, tuple(fires), tuple(supersedes))


def decide_all(
    schedules: list[Due],
    now: datetime,
    occupancy: dict[tuple[int, str], Occupancy],
    memo: "Memo | None" = None,
) -> list[Decision]:
    """Decide a batch; each distinct trigger's due times are computed once (no database access).

    A schedule with nothing in flight decides by its trigger, cursor and policy alone, so
    schedules alike in those share one decision's fires. A schedule not due yet (planned
    ahead) decides as at its next fire, and only with nothing in flight; else it waits.
    """
    memo = memo or Memo()
    decisions = []
    for schedule in schedules:
        in_flight = occupancy.get((schedule.pk, ""))
        ahead = schedule.next_fire_at is not None and schedule.next_fire_at > now
        if ahead and in_flight is not None:
            continue  # decided when due, on what is in flight then
        if in_flight is not None or schedule.paused_until is not None:
            # Decided alone: on what it has in flight, or its pause.
            at = schedule.next_fire_at if ahead else now
            assert at is not None  # a due schedule has a cursor
            decisions.append(decide(schedule, at, in_flight or Occupancy(), memo))
            continue
        key = (
            schedule.trigger_key(), schedule.next_fire_at, schedule.job, schedule.misfire,
            schedule.misfire_grace, schedule.overlap, schedule.max_concurrent, schedule.max_queued,
        )  # fmt: skip
        shared = memo.decisions.get(key)
        if shared is None:
            at = schedule.next_fire_at if ahead else now
            assert at is not None  # a due schedule has a cursor
            shared = memo.decisions[key] = decide(schedule, at, Occupancy(), memo)
        decisions.append(Decision(schedule, shared.cursor, shared.fires, (), shared.error))
    return decisions


class Memo:
    """What one batch has computed already, by the values it depends on."""

    def __init__(self) -> None:
        self.limit = get_settings().CATCHUP_LIMIT
        self.triggers: dict[tuple[Any, ...], triggers.Trigger | str] = {}  # -> trigger or error
        self.due: dict[tuple[Any, ...], DueTimes | str] = {}  # (trigger, cursor, now) -> ...
        self.decisions: dict[tuple[Any, ...], Decision] = {}
        self.first: dict[tuple[Any, ...], datetime | None] = {}  # (trigger, now) -> ...

    def first_fire_time(self, schedule: Due, now: datetime) -> datetime | None:
        """``Schedule.first_fire_time`` of the schedule's trigger; raises for a bad row."""
        key = (schedule.trigger_key(), now)
        if key not in self.first:
            self.first[key] = first_fire_time_of(schedule, now, schedule.calendars())
        return self.first[key]

    def trigger(self, schedule: Due) -> triggers.Trigger:
        """The schedule's trigger, built once per distinct trigger; raises for a bad row."""
        key = schedule.trigger_key()
        trigger = self.triggers.get(key)
        if trigger is None:
            try:
                trigger = schedule.trigger()
            except Exception as exc:
                trigger = f"Cannot plan: {exc}"
            self.triggers[key] = trigger
        if isinstance(trigger, str):
            raise _Failed(trigger)
        return trigger

    def due_times(self, schedule: Due, now: datetime) -> DueTimes:
        """The schedule's due times; raises (a bad row) as computing them would."""
        # Not whether its job is registered here: planning needs the trigger, not the code
        # (a process of another release may have the job, see fleet.py).
        trigger = self.trigger(schedule)
        key = schedule.trigger_key()
        due = self.due.get((key, schedule.next_fire_at, now))
        if due is None:
            try:
                cursor = overridden.walk_from(trigger, schedule.next_fire_at)
                due = _due_times(trigger, cursor, now, self.limit)
            except Exception as exc:
                due = f"Cannot plan: {exc}"
            self.due[key, schedule.next_fire_at, now] = due
        if isinstance(due, str):
            raise _Failed(due)
        return due


class _Failed(Exception):
    """A bad row, with the message to record (already prefixed)."""


def decide(
    schedule: Due, now: datetime, occupancy: Occupancy, memo: "Memo | None" = None
) -> Decision:
    """The runs a due schedule records at ``now`` and its next cursor (no database access).

    A schedule whose row makes deciding raise (its trigger, its policy's arithmetic, ...)
    gets a decision that carries the error instead.
    """
    memo = memo or Memo()
    try:
        return _decide(schedule, now, occupancy, memo)
    except Exception as exc:  # any bad row: one schedule fails, never the tick
        return _failed(schedule, exc)


def _failed(schedule: Due, exc: Exception) -> Decision:
    """The decision of a schedule that could not be decided: its error, its cursor kept."""
    if isinstance(exc, _Failed):
        return Decision(schedule, cursor=None, error=str(exc))
    if isinstance(exc, triggers.InvalidTrigger):
        return Decision(schedule, cursor=None, error=f"Cannot plan: {exc}")
    # Not a failure foreseen (a bad trigger or job): its traceback says where it broke.
    logger.warning("Deciding for schedule %r raised:", schedule.name, exc_info=exc)
    return Decision(schedule, cursor=None, error=f"Cannot plan: {type(exc).__name__}: {exc}")


def _decide(schedule: Due, now: datetime, occupancy: Occupancy, memo: "Memo") -> Decision:
    if _in_pause(schedule):
        return _paused(schedule, memo)
    due = memo.due_times(schedule, now)
    trigger = memo.trigger(schedule)
    times, fires = _open_and_closed(schedule, due.times, memo)
    status: str
    reason: str
    for plan_time, missed in policies.misfire_marks(schedule, times, now, memo.limit):
        if missed:
            status, reason = RunStatus.SKIPPED, ErrorCode.MISSED
        else:
            status, reason = policies.overlap_status(schedule, occupancy)
        plan, release = overridden.plan_time_of(trigger, plan_time)
        fires.append(Fire(plan, status, reason, release_at=release))
    if due.unlisted and times:
        latest = times[-1]
        message = policies.missed_span_note(latest)
        reason = ErrorCode.MISSED
        fires.append(Fire(due.unlisted, RunStatus.SKIPPED, reason, message))
    superseding = policies.supersedes_retry(occupancy, (fire.status for fire in fires))
    supersedes = ("",) if superseding else ()
    return Decision(schedule, due.cursor, tuple(fires), supersedes)


def _open_and_closed(
    schedule: Due, times: list[datetime], memo: "Memo"
) -> tuple[list[datetime], list[Fire]]:
    """The due times that run, and a skipped run for each that an override skips (code
    ``overridden``) or that starts a span its calendars close (``closed``,
    ``open_fires.PlanningTrigger``). A moved fire runs where it was moved, closed or not."""
    trigger = memo.trigger(schedule)
    calendars = overridden.inner_of(trigger)
    if trigger is calendars and not isinstance(calendars, open_fires.PlanningTrigger):
        return times, []  # no calendars, no overrides: nothing to look at
    open_times, closed = [], []
    for plan_time in times:
        override = overridden.override_at(trigger, plan_time)
        if override is not None and override.move_to is None:
            closed.append(Fire(plan_time, RunStatus.SKIPPED, ErrorCode.OVERRIDDEN, override.note))
            continue
        closure = overridden.closure(trigger, plan_time)
        if closure is None:
            open_times.append(plan_time)
            continue
        note = open_fires.closed_note(closure, schedule.on_closed_day)
        message = storable.storable_text(note, get_settings().ERROR_MAX_CHARS)
        closed.append(Fire(plan_time, RunStatus.SKIPPED, ErrorCode.CLOSED, message))
    return open_times, closed


def _due_times(
    trigger: triggers.Trigger, cursor: datetime | None, now: datetime, limit: int
) -> DueTimes:
    due: list[datetime] = []
    fire = cursor
    while fire is not None and fire <= now and len(due) <= limit:
        due.append(fire)
        fire = trigger.next_after(fire)
    if fire is None or fire > now:
        return DueTimes(due, fire)
    # More missed times than we list one by one: one row stands for those in between,
    # and the most recent is listed so that the misfire policy can fire it.
    latest = trigger.latest_at_or_before(now)
    assert latest is not None  # fire is a fire time at or before now
    if latest == fire:
        return DueTimes([*due, latest], trigger.next_after(now))
    return DueTimes([*due, latest], trigger.next_after(now), unlisted=fire)


def _in_pause(schedule: Due) -> bool:
    until, cursor = schedule.paused_until, schedule.next_fire_at
    return until is not None and cursor is not None and cursor < until


def _paused(schedule: Due, memo: "Memo") -> Decision:
    """A schedule due during its pause: one skipped run says that its fires until the
    pause ends are not run, and the cursor moves to the first fire at or after the end."""
    assert schedule.paused_until is not None and schedule.next_fire_at is not None
    until = schedule.paused_until
    after = memo.trigger(schedule).next_after(until - timedelta(microseconds=1))
    note = pause_note(until, schedule.pause_reason, schedule.paused_by)
    message = storable.storable_text(note, get_settings().ERROR_MAX_CHARS)
    fire = Fire(schedule.next_fire_at, RunStatus.SKIPPED, ErrorCode.PAUSED, message)
    return Decision(schedule, after, (fire,))
