"""Overridden fires: a schedule's trigger with single fires skipped or moved, the times
the planner's cursor walks (``Schedule.skip_fire()``, ``move_fire()``; docs/overrides.md).

Pure: no models, no database. ``OverriddenTrigger`` yields *effective* times: a skipped
fire at its own time (where its skipped run is recorded), a moved fire at its new time,
every other fire as the inner trigger gives it. ``override_at()`` maps an effective time
back to the fire it stands for, whose plan time keys its run in the ledger: a moved fire
can never run twice. ``move_error()`` is the rule a move obeys: a moved fire stays between
its neighbours (where they run), so the effective times keep the order of the fires.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django_periodic.timing.business_days import Closure
from django_periodic.timing.open_fires import PlanningTrigger
from django_periodic.timing.triggers import Trigger

# How far a fire may move from its plan time, either way, besides staying between its
# neighbours: a week, so that a one-shot or a yearly fire is not moved into another season.
MAX_MOVE = timedelta(days=7)

_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Override:
    """One fire (``plan_time``) skipped (``move_to`` None) or moved to ``move_to``;
    ``note`` is a skipped fire's run message."""

    plan_time: datetime
    move_to: datetime | None = None
    note: str = ""

    @property
    def at(self) -> datetime:
        """Its effective time: where the cursor meets it."""
        return self.move_to or self.plan_time


def skip_note(reason: str, by: str) -> str:
    """A skipped fire's run message: who skipped it, and why."""
    who = f" by {by}" if by else ""
    return f"Skipped by an override{who}: {reason}"


def move_error(
    plan_time: datetime,
    to: datetime,
    neighbours: tuple[datetime | None, datetime | None],
    now: datetime,
) -> str | None:
    """Why a fire at ``plan_time`` cannot move to ``to``, or None: it moves into the
    future, within ``MAX_MOVE`` of its plan time, and strictly between the effective
    times of the fires before and after it (``neighbours``, None where there is none)."""
    before, after = neighbours
    if to == plan_time:
        return "A move needs a time other than the fire's own."
    if to <= now:
        return f"A fire moves into the future (now: {now:%Y-%m-%d %H:%M:%S} UTC)."
    if abs(to - plan_time) > MAX_MOVE:
        return f"A fire moves at most {MAX_MOVE.days} days from its plan time."
    if before is not None and to <= before:
        return f"A fire moves after the fire before it ({before:%Y-%m-%d %H:%M:%S} UTC)."
    if after is not None and to >= after:
        return f"A fire moves before the fire after it ({after:%Y-%m-%d %H:%M:%S} UTC)."
    return None


@dataclass(frozen=True)
class OverriddenTrigger(Trigger):
    """The effective times of ``inner``'s fires under ``overrides``. An override whose
    plan time is not a fire of ``inner`` (its trigger was edited since) is ignored."""

    inner: Trigger
    overrides: tuple[Override, ...]
    _by_time: dict[datetime, Override] = field(init=False, repr=False, compare=False)
    _moved_from: dict[datetime, datetime] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        real = [o for o in self.overrides if self._is_fire(o.plan_time)]
        object.__setattr__(self, "_by_time", {o.at: o for o in real})
        moved = {o.plan_time: o.move_to for o in real if o.move_to is not None}
        object.__setattr__(self, "_moved_from", moved)

    def _is_fire(self, moment: datetime) -> bool:
        return self.inner.next_after(moment - _MICROSECOND) == moment

    def next_after(self, after: datetime) -> datetime | None:
        fire = self.inner.next_after(after)
        while fire is not None and fire in self._moved_from:
            fire = self.inner.next_after(fire)
        moved = [o.at for o in self._by_time.values() if o.move_to is not None and o.at > after]
        return min([*moved, *([fire] if fire is not None else [])], default=None)

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        fire = self.inner.latest_at_or_before(moment)
        while fire is not None and fire in self._moved_from:
            fire = self.inner.latest_at_or_before(fire - _MICROSECOND)
        moved = [o.at for o in self._by_time.values() if o.move_to is not None and o.at <= moment]
        return max([*moved, *([fire] if fire is not None else [])], default=None)

    def override_at(self, moment: datetime) -> Override | None:
        """The override whose effective time is ``moment``, or None."""
        return self._by_time.get(moment)

    def moved_to(self, moment: datetime) -> datetime | None:
        """Where the fire at ``moment`` was moved, or None (not moved)."""
        return self._moved_from.get(moment)


def overridden(trigger: Trigger, overrides: tuple[Override, ...]) -> Trigger:
    """``trigger`` under ``overrides``; itself when there are none."""
    return OverriddenTrigger(trigger, overrides) if overrides else trigger


def override_at(trigger: Trigger, moment: datetime) -> Override | None:
    """The override of ``trigger`` (if it is overridden) whose effective time is ``moment``."""
    return trigger.override_at(moment) if isinstance(trigger, OverriddenTrigger) else None


def walk_from(trigger: Trigger, start: datetime | None) -> datetime | None:
    """Where the planner's walk from ``start`` (its cursor) begins: there, or, for a cursor
    left at a fire that was moved away (set by a save that does not look at overrides),
    that fire's new time."""
    if start is None or not isinstance(trigger, OverriddenTrigger):
        return start
    return trigger.moved_to(start) or start


def inner_of(trigger: Trigger) -> Trigger:
    """The trigger an overridden one wraps (else ``trigger`` itself)."""
    return trigger.inner if isinstance(trigger, OverriddenTrigger) else trigger


def plan_time_of(trigger: Trigger, at: datetime) -> tuple[datetime, datetime | None]:
    """The plan time of the fire whose effective time is ``at``, and its release: a moved
    fire's new time (None: it runs at its plan time)."""
    override = override_at(trigger, at)
    return (at, None) if override is None else (override.plan_time, at)


def closure(trigger: Trigger, moment: datetime) -> Closure | None:
    """Why calendars close the fire at ``moment`` (``PlanningTrigger.closure``), or None:
    a moved fire runs where it was moved, closed or not."""
    inner = inner_of(trigger)
    if override_at(trigger, moment) is not None or not isinstance(inner, PlanningTrigger):
        return None
    return inner.closure(moment)
