"""``Schedule.explain()`` and ``explain_page()``: what became of every fire of a schedule's
trigger in a window.

Every nominal fire (the trigger before its calendars and bounds) gets one account, from what
the database holds, with nothing stored for it: its runs (one per scope), its override, its
calendars' closures (a closed span's fires, of which one skipped run stands for all, are
expanded fire by fire here), the spans of pauses and of missed times for which one skipped
run stands (expanded from the end its message names), the schedule's bounds, ``max_runs``,
its versions (a fire before its trigger last changed, or while it was disabled) and its
cursor (a fire not planned yet). Runs in the window that no fire of the trigger as it is
now accounts for (an earlier trigger's) get an account of their own.

A call reads one part of its window (``pages.py``: a page, or a whole window of at most
``MAX_FIRES`` fires): the part's rows alone, in a constant number of queries, so a page
costs the same however long its window.
"""

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q

from django_periodic import choices, policies
from django_periodic.choices import ErrorCode, OnClosedDay, OverrideAction, RunStatus
from django_periodic.db import clock
from django_periodic.models.calendars import closures_of
from django_periodic.models.explaining import downstream
from django_periodic.models.explaining.accounts import (
    RUN_FIELDS,
    FireAccount,
    FireStatus,
    RunRow,
    from_runs,
)
from django_periodic.models.explaining.pages import (
    MAX_FIRES,
    PAGE_SIZE,
    ExplainPage,
    Part,
    check_window,
    ledger_runs,
)
from django_periodic.models.overrides import FireOverride
from django_periodic.models.pausing import pause_end
from django_periodic.models.schedule_fields import TRIGGER_FIELDS, ScheduleFields
from django_periodic.models.trigger_rows import trigger_of
from django_periodic.models.versions import ScheduleVersion
from django_periodic.timing import bounds, business_days, open_fires, triggers

# The changes that make a schedule's earlier fires another trigger's (its versions).
_TRIGGER_CHANGES = [*TRIGGER_FIELDS, "on_closed_day"]
# The skipped runs that stand for a span of fires, and where their message says it ends.
_SPANS = {ErrorCode.PAUSED: pause_end, ErrorCode.MISSED: policies.missed_span_end}
# Their messages name their end to the second: a fire within that second is still theirs
# (a fire after a span has a run of its own, which is read first).
_SECOND = timedelta(seconds=1)
_MICROSECOND = timedelta(microseconds=1)


class Explaining(ScheduleFields):
    """What became of a schedule's fires (docs/explain.md): ``explain()``,
    ``explain_page()``."""

    class Meta:
        abstract = True

    def explain(
        self, since: datetime, until: datetime, scope: str | None = None
    ) -> list[FireAccount]:
        """One account for every fire of the schedule's trigger in ``[since, until)``, in order:
        what became of it (``FireStatus``), its code, the details in words and its run.

        ``scope`` names one scope key of a fanned-out schedule: the accounts of its runs alone.
        None: each fire's account sums up all its scopes' runs (their statuses counted in
        ``scopes``; ``mixed`` when they differ). Raises ValueError for a window that is not one
        (``check_window()``) or that holds more than ``MAX_FIRES`` fires (read it with
        ``explain_page()``), and InvalidTrigger for a schedule whose trigger cannot be built.
        See docs/explain.md.
        """
        check_window(since, until)
        if self.is_downstream:
            return downstream.accounts(self, since, until, scope)
        part = Part.find(self, since, until, None, scope, MAX_FIRES)
        if part.next_after is not None:
            raise ValueError(
                f"The window holds more than {MAX_FIRES:,} fires: narrow it, or read it a page "
                "at a time (explain_page())."
            )
        return _Facts.load(self, part, scope).accounts(part)

    def explain_page(
        self,
        since: datetime,
        until: datetime,
        scope: str | None = None,
        after: datetime | None = None,
    ) -> ExplainPage:
        """The accounts of the window's first ``PAGE_SIZE`` fires after ``after`` (None: from
        ``since``), as ``explain()`` gives them, with where the next page continues. A page
        costs the same however long its window. Raises as ``explain()`` does, but never for a
        window's length. See docs/explain.md.
        """
        check_window(since, until, after)
        if self.is_downstream:
            start = since if after is None else max(since, after + _MICROSECOND)
            found = downstream.accounts(self, start, until, scope)
            page = found[:PAGE_SIZE]
            next_after = page[-1].plan_time if len(found) > PAGE_SIZE else None
            return ExplainPage(since, until, after, tuple(page), next_after)
        part = Part.find(self, since, until, after, scope, PAGE_SIZE)
        accounts = _Facts.load(self, part, scope).accounts(part)
        return ExplainPage(since, until, after, tuple(accounts), part.next_after)


@dataclass
class _Facts:
    """What the database says of a schedule's fires in a part of a window, read once."""

    schedule: ScheduleFields
    now: datetime
    runs: dict[datetime, list[RunRow]]
    overrides: dict[datetime, FireOverride]
    spans: list[tuple[datetime, datetime, RunRow]]  # [start, end) a skipped run stands for
    closures: business_days.Closures | None = None
    calendar_error: str = ""
    # With calendars that shift closed fires: the fires that run, and where each closed fire
    # of the part runs instead (None: nowhere).
    opened: open_fires.OpenTrigger | None = None
    shifts: dict[datetime, datetime | None] = field(default_factory=dict)
    last_change: datetime | None = None  # its trigger's last change (its versions)
    disabled: list[tuple[datetime, datetime]] = field(default_factory=list)
    last_planned: datetime | None = None  # with max_runs reached: its last run's plan time

    @classmethod
    def load(cls, schedule: ScheduleFields, part: Part, scope: str | None) -> "_Facts":
        using = schedule._state.db or "default"
        runs = ledger_runs(schedule, scope)
        facts = cls(schedule, clock.now(using), defaultdict(list), {}, [])
        facts._read_calendars(part.fires)
        # The part's runs, and those its closed fires were shifted to out of it.
        shifted = [t for t in facts.shifts.values() if t is not None]
        elsewhere = [t for t in shifted if not part.start <= t < part.stop]
        read = runs.filter(
            Q(plan_time__gte=part.start, plan_time__lt=part.stop) | Q(plan_time__in=elsewhere)
        )
        for row in read.order_by("plan_time", "scope").values_list(*RUN_FIELDS):
            run = RunRow(*row)
            facts.runs[run.plan_time].append(run)
            facts._add_span(run)
        # The span of one that started before the part may reach into it.
        spanning = runs.filter(
            plan_time__lt=part.start, status=RunStatus.SKIPPED, error_code__in=list(_SPANS)
        )
        for row in spanning.order_by("-plan_time").values_list(*RUN_FIELDS)[:1]:
            facts._add_span(RunRow(*row))
        overrides = FireOverride.objects.using(using).filter(
            schedule_id=schedule.pk, plan_time__gte=part.start, plan_time__lt=part.stop
        )
        facts.overrides = {override.plan_time: override for override in overrides}
        facts._read_versions(using)
        if schedule.has_ended:  # its max_runs fires planned (models/schedule_fields.py)
            latest = schedule.runs.using(using).filter(trigger__in=choices.LEDGER_TRIGGERS)
            facts.last_planned = (
                latest.order_by("-plan_time").values_list("plan_time", flat=True).first()
            )
        return facts

    def _read_calendars(self, fires: list[datetime]) -> None:
        """Its calendars' closures and, if they shift closed fires, where these fires run."""
        try:
            self.closures = closures_of(self.schedule)
        except triggers.InvalidTrigger as exc:
            self.calendar_error = str(exc)
            return
        on_closed_day = self.schedule.on_closed_day
        if self.closures is None or on_closed_day == OnClosedDay.SKIP:
            return
        # Bounds are the open trigger's: a shift out of them is not run.
        opened = open_fires.OpenTrigger(trigger_of(self.schedule), self.closures, on_closed_day)
        self.opened = opened
        for fire in fires:
            closure = self.closures.closure(fire)
            if closure is not None and not closure.blackout:
                self.shifts[fire] = opened.shifted(fire)

    def accounts(self, part: Part) -> list[FireAccount]:
        """The accounts of the part's fires, and of its runs that none accounts for, in order."""
        found = [self.account(plan_time) for plan_time in part.fires]
        found += self.unmatched(part.start, part.stop)
        return sorted(found, key=lambda account: (account.plan_time, account.scope))

    def _add_span(self, run: RunRow) -> None:
        if run.status != RunStatus.SKIPPED or run.error_code not in _SPANS:
            return
        end = _SPANS[run.error_code](run.error_message)  # type: ignore[index]
        if end is not None:
            self.spans.append((run.plan_time, end + _SECOND, run))

    def _read_versions(self, using: str) -> None:
        """When its trigger last changed, and the spans it was disabled, by its versions."""
        versions = ScheduleVersion.objects.using(using).filter(
            schedule_id=self.schedule.pk, changes__has_any_keys=[*_TRIGGER_CHANGES, "enabled"]
        )
        off: datetime | None = None
        for created_at, changes in versions.order_by("created_at", "id").values_list(
            "created_at", "changes"
        ):
            if set(changes) & set(_TRIGGER_CHANGES):
                self.last_change = created_at
            if "enabled" in changes:
                now_enabled = bool(changes["enabled"][1])
                if not now_enabled and off is None:
                    off = created_at
                elif now_enabled and off is not None:
                    self.disabled.append((off, created_at))
                    off = None
        if off is not None:
            self.disabled.append((off, bounds.LATEST))

    # -- one fire's account --------------------------------------------------------------------

    def account(self, plan_time: datetime) -> FireAccount:
        """What became of the fire at ``plan_time``."""
        schedule = self.schedule
        if schedule.start_at is not None and plan_time < schedule.start_at:
            detail = f"Before its start_at ({_show(schedule.start_at)})."
            return FireAccount(plan_time, FireStatus.BEFORE_START, detail=detail)
        if schedule.end_at is not None and plan_time > schedule.end_at:
            detail = f"After its end_at ({_show(schedule.end_at)})."
            return FireAccount(plan_time, FireStatus.AFTER_END, detail=detail)
        override = self.overrides.get(plan_time)
        note = _override_note(override)
        if runs := self.runs.pop(plan_time, None):
            return from_runs(
                plan_time, runs, self.now, note
            )  # a moved fire's run keeps its plan time
        if override is not None and override.action == OverrideAction.SKIP:
            return FireAccount(plan_time, FireStatus.OVERRIDDEN, ErrorCode.OVERRIDDEN, note)
        return self._before(plan_time) or self._unrecorded(plan_time, note)

    def _before(self, plan_time: datetime) -> FireAccount | None:
        """A fire of a time the trigger as it is now did not hold yet."""
        if plan_time < self.schedule.created_at:
            created = _show(self.schedule.created_at)
            detail = f"Before the schedule was created ({created})."
            return FireAccount(plan_time, FireStatus.BEFORE_CREATED, detail=detail)
        if self.last_change is not None and plan_time < self.last_change:
            detail = f"Before its trigger last changed ({_show(self.last_change)})."
            return FireAccount(plan_time, FireStatus.BEFORE_CHANGE, detail=detail)
        return None

    def _unrecorded(self, plan_time: datetime, note: str) -> FireAccount:
        """A fire with no run at its own time: closed, moved, in a span, or not yet."""
        if closed := self._closed(plan_time):
            return closed
        if note:  # moved, not run yet
            return FireAccount(plan_time, FireStatus.MOVED, detail=note)
        for start, end, run in self.spans:
            if start < plan_time < end:
                paused = run.error_code == ErrorCode.PAUSED
                status = FireStatus.PAUSED if paused else FireStatus.SKIPPED
                detail = f"{run.error_message} (one skipped run, #{run.pk}, stands for the span)"
                return FireAccount(plan_time, status, run.error_code, detail, None, run.scope)
        return self._not_run(plan_time)

    def _not_run(self, plan_time: datetime) -> FireAccount:
        schedule = self.schedule
        if self._ended(plan_time):
            detail = f"It reached its max_runs ({schedule.max_runs}): no fire after its last."
            return FireAccount(plan_time, FireStatus.AFTER_MAX_RUNS, detail=detail)
        for start, end in self.disabled:
            if start <= plan_time < end:
                detail = f"The schedule was disabled from {_show(start)}."
                return FireAccount(plan_time, FireStatus.DISABLED, detail=detail)
        cursor = schedule.next_fire_at
        # Not planned yet: at or after its cursor (with none, after now).
        ahead = plan_time >= cursor if cursor is not None else plan_time > self.now
        if ahead and schedule.paused_until is not None and plan_time < schedule.paused_until:
            detail = f"{_pause_of(schedule)} (not planned yet)."
            return FireAccount(plan_time, FireStatus.PAUSED, ErrorCode.PAUSED, detail)
        if plan_time > self.now and not schedule.enabled:
            return FireAccount(plan_time, FireStatus.DISABLED, detail="The schedule is disabled.")
        if ahead:
            detail = f"Its next fire is at {_show(cursor)}." if cursor else "It has no next fire."
            return FireAccount(plan_time, FireStatus.NOT_PLANNED_YET, detail=detail)
        detail = (
            "No run and no reason found: this should not happen (its runs pruned? a row "
            "changed by hand?)."
        )
        if self.calendar_error:
            detail += f" Its calendars cannot be used: {self.calendar_error}"
        return FireAccount(plan_time, FireStatus.NO_RECORD, detail=detail)

    def _ended(self, plan_time: datetime) -> bool:
        if not self.schedule.has_ended:  # max_runs not reached (models/schedule_fields.py)
            return False
        return self.last_planned is None or plan_time > self.last_planned

    def _closed(self, plan_time: datetime) -> FireAccount | None:
        """A fire its calendars close: not run, or run on another day (its account then)."""
        if self.closures is None or (closure := self.closures.closure(plan_time)) is None:
            return None
        note = open_fires.closed_note(closure, self.schedule.on_closed_day)
        shifted = self.shifts.get(plan_time)
        if shifted is not None and (runs := self.runs.pop(shifted, None)):
            moved = f"Closed ({closure}): run on {_show(shifted)} instead."
            return from_runs(plan_time, runs, self.now, moved)
        if shifted is not None:
            note = f"{note} It runs at {_show(shifted)}."
        return FireAccount(plan_time, FireStatus.CLOSED, ErrorCode.CLOSED, note)

    def unmatched(self, start: datetime, stop: datetime) -> Iterator[FireAccount]:
        """The runs in ``[start, stop)`` that no fire of the trigger as it is now accounts
        for. A run of a closed fire shifted there is that fire's: its account, in the part
        of the window that holds the fire, says so."""
        for plan_time, runs in self.runs.items():
            if start <= plan_time < stop and not self._shifted_to(plan_time):
                note = "Not a fire of its trigger as it is now (an earlier trigger's)."
                yield from_runs(plan_time, runs, self.now, note)

    def _shifted_to(self, plan_time: datetime) -> bool:
        """Whether a closed fire runs at ``plan_time``, shifted there by its calendars (a
        fire of the part at its own time has taken its runs already)."""
        if self.opened is None:
            return False
        return self.opened.next_after(plan_time - _MICROSECOND) == plan_time


def _override_note(override: FireOverride | None) -> str:
    if override is None:
        return ""
    who = f" by {override.by}" if override.by else ""
    if override.action == OverrideAction.MOVE:
        assert override.move_to is not None  # a CHECK constraint
        return f"Moved to {_show(override.move_to)}{who}: {override.reason}."
    return f"Skipped{who}: {override.reason}."


def _pause_of(schedule: ScheduleFields) -> str:
    who = f" by {schedule.paused_by}" if schedule.paused_by else ""
    assert schedule.paused_until is not None
    return f"Paused until {_show(schedule.paused_until)}{who}: {schedule.pause_reason}"


def _show(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
