"""What planning reads and decides, as records: a due schedule's columns as loaded
(``Due``), a run to record for one of its fires (``Fire``) and a schedule's decision, its
fires and where its cursor moves (``Decision``). decisions.py takes decisions from them;
the planner and the ledger backends record them."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_periodic.models import planning_trigger_of
from django_periodic.timing import business_days, overridden, triggers


@dataclass(frozen=True)
class Fire:
    """A run to record for a plan time (and scope): pending, queued or skipped (with why)."""

    plan_time: datetime
    status: str
    error_code: str = ""
    error_message: str = ""
    scope: str = ""
    release_at: datetime | None = None  # a moved fire's new time (timing/overridden.py)


@dataclass(slots=True)
class Due:
    """The columns of a locked due schedule that planning reads (a ``policies.Policy``)."""

    pk: int
    name: str
    job: str
    cron: str
    timezone: str
    interval: timedelta | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    created_at: datetime | None  # only where it anchors an interval (else not loaded)
    next_fire_at: datetime | None
    overlap: str
    max_queued: int
    max_concurrent: int | None
    misfire: str
    misfire_grace: timedelta
    planning_failures: int
    scopes: str  # the scope provider of a fanned-out schedule, else ""
    paused_until: datetime | None = None  # Schedule.pause()
    pause_reason: str = ""
    paused_by: str = ""
    dst_gap: str = ""  # a cron's DST choices (Schedule.dst_gap, dst_repeat)
    dst_repeat: str = ""
    on_closed_day: str = ""  # under calendars (Schedule.on_closed_day)
    has_calendars: bool = False
    jitter: timedelta | None = None  # its runs' stagger (timing/stagger.py)
    job_unknown_since: datetime | None = None  # no live process has had its job (fleet.py)
    max_runs: int | None = None  # its lifecycle (ending.py)
    fire_count: int = 0
    has_overrides: bool = False  # fires skipped or moved from its cursor on (overrides.py)
    rrule: str = ""  # an RRULE's text (Schedule.rrule)
    # The runs' snapshot; on PostgreSQL the INSERT takes it from the locked rows instead.
    args: Any = None
    kwargs: Any = None
    max_attempts: int = 1
    tasks_backend: str = ""
    revision: int = 1
    # Its calendars, loaded once per batch (planner), or why they cannot be used.
    closures: business_days.Closures | None = None
    calendar_error: str = ""
    overrides: tuple[overridden.Override, ...] = ()  # loaded once per batch (planner)

    def trigger_key(self) -> tuple[Any, ...]:
        """What ``Schedule.trigger`` depends on: equal keys, equal triggers."""
        # An interval without start_at is anchored at created_at: only then is it part of it.
        anchored = not self.cron and self.interval is not None and self.start_at is None
        anchor = self.created_at if anchored else None
        return (
            self.cron,
            self.timezone,
            self.dst_gap,
            self.dst_repeat,
            self.interval,
            self.run_at,
            self.rrule,
            self.start_at,
            self.end_at,
            anchor,
            self.on_closed_day if self.has_calendars else "",
            self.closures,
            self.calendar_error,
            self.overrides,
        )

    def trigger(self) -> triggers.Trigger:
        """What its cursor walks, built by the model's own rules (``models.trigger_of``),
        under its calendars (``models.planning_trigger_of``) and its overrides."""
        return overridden.overridden(planning_trigger_of(self, self.calendars()), self.overrides)

    def calendars(self) -> business_days.Closures | None:
        """Its calendars' rules; raises InvalidTrigger if they could not be loaded."""
        if self.calendar_error:
            raise triggers.InvalidTrigger(self.calendar_error)
        return self.closures


@dataclass(slots=True)
class Decision:
    """What one schedule does this tick: the runs to record and where its cursor moves."""

    schedule: Due
    cursor: datetime | None
    fires: tuple[Fire, ...] = ()
    # The scopes ("" unscoped) whose run waiting to retry a new fire supersedes.
    supersedes: tuple[str, ...] = ()
    error: str = ""
