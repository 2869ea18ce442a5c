"""The records the engine's steps and the ledger backends pass each other, plain data
(the modules that make them own the rules), at the bottom of the engine: a backend
imports these and nothing else of the engine.

- planning: a due schedule's columns as loaded (``Due``), a run to record for one of its
  fires (``Fire``), a schedule's decision (``Decision``), and a decision as the ledger
  records it, with what the engine worked out for its statement (``Recorded``); a
  backfill's range and the runs it inserted; a run the planner recorded;
- claiming: each run claimed with the token of its lease (``Claim``), what a claim ended
  without running (``ClaimResult``), who asks and for which runs (``ClaimRequest``);
- an attempt's end (``AttemptOutcome``, ``Failure``) and what the look ahead found
  (``Horizon``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django_periodic.models import Run
from django_periodic.models.run import past_start_deadline
from django_periodic.models.trigger_rows import planning_trigger_of
from django_periodic.timing import bounds, business_days, overridden, triggers


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
    max_runs: int | None = None  # its lifecycle (recording.capped)
    fire_count: int = 0
    has_overrides: bool = False  # fires skipped or moved from its cursor on (overrides.py)
    rrule: str = ""  # an RRULE's text (Schedule.rrule)
    finish_within: timedelta | None = None  # its runs' deadline (policies.finish_by)
    # The runs' snapshot; on PostgreSQL the INSERT takes it from the locked rows instead.
    args: Any = None
    kwargs: Any = None
    max_attempts: int = 1
    tasks_backend: str = ""
    revision: int = 1
    concurrency_limit_id: int | None = None
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
        """What its cursor walks, built by the model's own rules (``trigger_rows.trigger_of``),
        under its calendars (``trigger_rows.planning_trigger_of``) and its overrides."""
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


@dataclass
class PlanResult:
    """What planning one batch (or a tick of several) did: schedules planned, fires, failures."""

    schedules: int = 0
    fired: int = 0
    late: int = 0  # of the fired, those past their misfire grace (fired by policy)
    skipped: int = 0
    failed: list[str] = field(default_factory=list)  # schedules that could not be planned
    disabled: list[str] = field(default_factory=list)  # ...and were disabled for it

    def __add__(self, other: PlanResult) -> PlanResult:
        """Two batches' results as one (for a tick of several batches)."""
        return PlanResult(
            self.schedules + other.schedules,
            self.fired + other.fired,
            self.late + other.late,
            self.skipped + other.skipped,
            self.failed + other.failed,
            self.disabled + other.disabled,
        )


# A fire as recorded: the fire, its run's release, its start deadline and its deadline to
# finish (finish_by).
FireRow = tuple[Fire, datetime | None, datetime | None, datetime | None]


@dataclass(frozen=True)
class Recorded:
    """A decision as the ledger records it, with what planning worked out for its statement
    (``planning/recording.py``): how many fires ``fire_count`` counts, and each fire's
    release, start deadline and deadline to finish."""

    decision: Decision
    counted: int
    fires: tuple[FireRow, ...]


@dataclass(frozen=True, slots=True)
class LateRun:
    """A run found unfinished past its deadline to finish (``Run.finish_by``), flagged late
    by the pass that found it (engine/runs/deadlines.py)."""

    pk: int
    schedule_id: int
    schedule: str  # its name
    scope: str
    plan_time: datetime
    attempt: int
    status: str
    finish_by: datetime
    cancel: bool  # its schedule's cancel_when_late

    def late_by(self, now: datetime) -> timedelta:
        """How far past its deadline it is at ``now``."""
        return now - self.finish_by


LATE_MESSAGE = "No worker could start it within its misfire grace."
UNLEASABLE_MESSAGE = (
    f"Cannot claim: its schedule's lease_timeout would make its lease expire after "
    f"{bounds.LATEST:%Y-%m-%d}, past every time a row may hold."
)


def can_lease(lease_timeout: timedelta, now: datetime) -> bool:
    """Whether a lease taken at ``now`` expires within the range of stored times
    (``UNLEASABLE`` in the PostgreSQL claim says the opposite in SQL)."""
    return lease_timeout < bounds.LATEST - now


@dataclass(frozen=True, slots=True)
class ClaimedValues:
    """What the engine reads of a claimed run between its claim and its outcome: the few
    values the executor, the pool and the outcome writer need (its schedule's too)."""

    pk: int
    schedule_id: int
    job_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    plan_time: datetime
    release_time: datetime
    start_deadline: datetime | None
    started_at: datetime | None
    timeout: timedelta | None  # the schedule's
    overlap: str  # the schedule's
    pause_after_failures: int | None  # the schedule's (planning/self_pausing.py)
    concurrency_limit_id: int | None  # the run's: its end frees a slot (runs/admission.py)

    @classmethod
    def of(cls, run: Run) -> ClaimedValues:
        """The values of a run instance (and of its schedule)."""
        schedule = run.schedule
        return cls(
            run.pk,
            run.schedule_id,
            run.job_name,
            run.args,
            run.kwargs,
            run.attempt,
            run.plan_time,
            run.release_time,
            run.start_deadline,
            run.started_at,
            schedule.timeout,
            schedule.overlap,
            schedule.pause_after_failures,
            run.concurrency_limit_id,
        )


@dataclass(frozen=True)
class Claim:
    """A run this process holds, and the token that proves it (which alone tells claims
    apart: hashing a model instance costs more, and claims are kept in sets and dicts).

    The run travels as its ``values``; the model instance (``run``, with its schedule) is
    built by ``build`` when first asked for: by a job reading its context's run, a signal's
    receivers, a failure's retry policy. Most runs of short jobs never need it.
    """

    values: ClaimedValues = field(compare=False)
    token: UUID
    using: str = field(default="default", compare=False)
    # When this process made the claim (time.monotonic()), to date the job's real start.
    claimed_at: float = field(default_factory=time.monotonic, compare=False)
    # The database's clock at the claim; None: the run's started_at (claimed when due).
    db_claimed_at: datetime | None = field(default=None, compare=False)
    build: Callable[[], Run] | None = field(default=None, compare=False, repr=False)
    _built: list[Run] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of(cls, run: Run, token: UUID, using: str = "default", **fields: Any) -> Claim:
        """The claim of a run instance already built."""
        return cls(ClaimedValues.of(run), token, using, _built=[run], **fields)

    @property
    def run(self) -> Run:
        """The run's model instance, built on first use (``build``)."""
        if not self._built:
            assert self.build is not None
            self._built.append(self.build())
        return self._built[0]

    @property
    def _db_claimed(self) -> datetime | None:
        return self.db_claimed_at or self.values.started_at

    def db_time(self, monotonic: float) -> datetime | None:
        """The database's clock at ``monotonic`` (a later time.monotonic()) as this process
        counts it: the claim's time plus the time since."""
        claimed = self._db_claimed
        if claimed is None:
            return None
        return claimed + timedelta(seconds=monotonic - self.claimed_at)

    def too_late(self, at: datetime | None) -> bool:
        """Whether a first start at ``at`` comes past the run's start deadline (it waited
        for a thread, claimed ahead, while all were busy): it must be skipped instead."""
        # Claimed, its first attempt is 1: until then it was not started (attempt 0).
        if self.values.attempt != 1 or at is None:
            return False
        return past_start_deadline(self.values.start_deadline, at)

    def starts_at(self) -> float:
        """When the run may start (time.monotonic()): at once, or at its release if it was
        claimed ahead of it."""
        claimed, release = self._db_claimed, self.values.release_time
        if claimed is None or release <= claimed:
            return self.claimed_at
        return self.claimed_at + (release - claimed).total_seconds()


@dataclass
class ClaimResult:
    claims: list[Claim] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # schedules of the runs skipped as late
    refused: list[int] = field(default_factory=list)  # ...and of those failed cannot_claim
    # The runs themselves, whose signals the engine sends (runs/claims.py).
    late_runs: list[int] = field(default_factory=list)
    refused_runs: list[int] = field(default_factory=list)

    def __add__(self, other: ClaimResult) -> ClaimResult:
        return ClaimResult(
            self.claims + other.claims,
            self.late + other.late,
            self.refused + other.refused,
            self.late_runs + other.late_runs,
            self.refused_runs + other.refused_runs,
        )


@dataclass(frozen=True)
class ClaimRequest:
    """Who claims (the lease's holder and process), and which runs: those its workers
    execute, or one run by id (a tasks backend's worker); of its ``jobs`` only, those its
    code registers (a process of another release may have others: see fleet.py)."""

    holder: str
    jobs: tuple[str, ...]
    process_id: int | None = None
    run_id: int | None = None
    # The claiming thread calls the job right after the claim (a tasks backend's worker):
    # the claim marks the lease started too (starts.py marks the others).
    starts_at_once: bool = False


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed; ``retryable`` False fails the run even with attempts left."""

    code: str
    message: str
    traceback: str = ""
    retryable: bool = True


# What an ended attempt writes on its run depends on its new status: a run skipped (claimed
# ahead, too late to start) never started, and one given back (pending) has not ended, so
# neither has a duration. The backends' outcome statements (the ORM's and OUTCOMES_SQL,
# built from these) both read them; tests/test_rules.py checks that the two write the same.
NEVER_STARTED = (Run.Status.SKIPPED,)
NOT_ENDED = (Run.Status.PENDING,)


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt ended: the lease's outcome and the run's new state.

    Built by the functions below, whose result and error texts are as they will be stored
    (``storable_result``, ``storable_text``).
    """

    claim: Claim
    lease_outcome: str
    status: str
    result_json: str | None = None  # the result as stored, in JSON (one encoding per run)
    error_code: str = ""
    error_message: str = ""
    traceback: str = ""
    retry_in: timedelta | None = None
    interrupted: bool = False  # cut short by its process stopping (counts as no attempt)
    started_at: datetime | None = None  # when the job really started, if after the claim
    recorded: bool = False  # already recorded, with an atomic job's writes (runs/atomic.py)

    @property
    def result(self) -> Any:
        """The result as stored (``storable.storable_result``)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def started(self, at: datetime | None) -> AttemptOutcome:
        return replace(self, started_at=at)


@dataclass(frozen=True)
class Horizon:
    now: datetime  # the database's clock
    next_fire: datetime | None  # earliest cursor of an enabled schedule
    next_retry: datetime | None  # earliest retry of a run waiting to retry (not enqueued)
    next_expiry: datetime | None  # earliest expiry of a lease still held, by any process
    next_pending: datetime | None  # earliest release of a run our workers may claim
    next_handoff: datetime | None  # earliest release of a handed-off run not enqueued
    next_enqueued: datetime | None  # earliest enqueue of a handed-off run still waiting
    # earliest deadline to finish of an unfinished run not found late (Run.finish_by)
    next_deadline: datetime | None = None
    # A lease is held by a process that lost its session lock: it died (presence.py).
    orphaned: bool = False

    def claimable(self) -> bool:
        """A run may be claimed to start now."""
        retry_due = self.next_retry is not None and self.next_retry <= self.now
        return _reached(self.next_pending, self.now) or retry_due

    def claimable_ahead(self, ahead: timedelta) -> bool:
        """A pending run is due within ``ahead``: it may be claimed to start on time."""
        return _reached(self.next_pending, self.now + ahead)

    def fire_due(self, ahead: timedelta = timedelta(0)) -> bool:
        """A schedule fires within ``ahead`` (now, by default)."""
        return _reached(self.next_fire, self.now + ahead)

    def handoff_due(self, pickup_timeout: timedelta) -> bool:
        """A handed-off run may start (or be retried) and has no task yet, or its task has
        waited past ``pickup_timeout`` (presumed lost): dispatch."""
        enqueued = self.next_enqueued
        redeliver = None if enqueued is None else enqueued + pickup_timeout
        due = (self.next_handoff, self.next_retry, redeliver)
        return any(_reached(at, self.now) for at in due)

    def lease_expired(self) -> bool:
        """A lease expired, or its holder died: sweep."""
        expired = self.next_expiry is not None and self.next_expiry < self.now
        return expired or self.orphaned


def _reached(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


# A run inserted: its id, scope, plan time and release time.
BackfilledRow = tuple[int, str, datetime, datetime]


@dataclass(frozen=True)
class InRange:
    start: datetime
    end: datetime
    times: list[datetime]
    scopes: list[str]
    # The fields every run of the backfill has alike (``backfill.new_run_fields``).
    run_fields: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.times) * len(self.scopes)


# A run recorded: (id, schedule id, scope, plan time, status, error code).
PlannedRow = tuple[int | None, int, str, datetime, str, str]


# A run series' bucket: (its start, runs started in it, their lag's p50 and p99).
Bucket = tuple[datetime, int, timedelta | None, timedelta | None]


def truncated(moment: datetime, unit: str) -> datetime:
    """The start of the ``unit`` (minute or hour, in UTC) that holds ``moment``: the bucket of
    a run series (``run_series``) that a moment falls in."""
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    return moment.replace(minute=0) if unit == "hour" else moment
