"""What planning passes from deciding to recording.

A due schedule's columns as loaded (``Due``), the runs a decision records for it (``Fire``)
and where its cursor moves (``Decision``). The planner produces these; the recording
module writes them without importing the planner.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_periodic import triggers
from django_periodic.models import trigger_of


@dataclass(frozen=True)
class Fire:
    """A run to record for a plan time (and scope): pending, queued or skipped (with why)."""

    plan_time: datetime
    status: str
    error_code: str = ""
    error_message: str = ""
    scope: str = ""


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
    # The runs' snapshot; on PostgreSQL the INSERT takes it from the locked rows instead.
    args: Any = None
    kwargs: Any = None
    max_attempts: int = 1
    tasks_backend: str = ""
    revision: int = 1

    def trigger_key(self) -> tuple[Any, ...]:
        """What ``Schedule.trigger`` depends on: equal keys, equal triggers."""
        # An interval without start_at is anchored at created_at: only then is it part of it.
        anchored = not self.cron and self.interval is not None and self.start_at is None
        anchor = self.created_at if anchored else None
        return (
            self.cron,
            self.timezone,
            self.interval,
            self.run_at,
            self.start_at,
            self.end_at,
            anchor,
        )

    def trigger(self) -> triggers.Trigger:
        """The schedule's trigger, built by the model's own rules (``models.trigger_of``)."""
        return trigger_of(self)


@dataclass(slots=True)
class Decision:
    """What one schedule does this tick: the runs to record and where its cursor moves."""

    schedule: Due
    cursor: datetime | None
    fires: tuple[Fire, ...] = ()
    # The scopes ("" unscoped) whose run waiting to retry a new fire supersedes.
    supersedes: tuple[str, ...] = ()
    error: str = ""
