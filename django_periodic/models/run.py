"""Runs: the ledger, one row per (schedule, scope, plan time), and its outcome."""

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext_lazy as _

from django_periodic import choices, db, policies
from django_periodic import scopes as scope_providers
from django_periodic.conf import tasks_backend_for
from django_periodic.db import clock
from django_periodic.models import limits
from django_periodic.models.schedule_fields import ScheduleFields, ledger_format_field

# The statuses of runs a worker may claim (when due): choices.py holds every status set.
CLAIMABLE_STATUSES = choices.CLAIMABLE_STATUSES
# Runs not finished: a deadline watches these (engine/runs/deadlines.py, its index below).
ACTIVE_STATUSES = choices.ACTIVE_STATUSES
# Backfilled runs wait as retries do, until their release (see backfill.py); a newer fire
# neither supersedes them nor counts them as a retry of its own.
BACKFILLED = Q(trigger=choices.RunTrigger.BACKFILL)
# A backfilled run not started yet: it waits in retrying, attempt 0, until next_retry_at.
# The values once: the query below and Run.awaits_release read them.
AWAITING_RELEASE_VALUES: dict[str, str | int] = {
    "trigger": choices.RunTrigger.BACKFILL,
    "status": choices.RunStatus.RETRYING,
    "attempt": 0,
}
AWAITING_RELEASE = Q(**AWAITING_RELEASE_VALUES)
# A run too late to start: one not started yet (pending, no attempt made) whose start
# deadline has passed, skipped instead of started. The values once, and the deadline's
# comparison once: RunQuerySet.too_late_to_start, Run.too_late_to_start and a claimed run's
# Claim.too_late read them; the PostgreSQL claim's SQL is built from the queryset's
# (backends/postgresql/claims.py, tests/test_rules.py checks).
NOT_STARTED_VALUES: dict[str, str | int] = {"status": choices.RunStatus.PENDING, "attempt": 0}


def past_start_deadline(start_deadline: datetime | None, at: datetime) -> bool:
    """Whether a first start at ``at`` comes after ``start_deadline`` (None: never)."""
    return start_deadline is not None and at > start_deadline


def past_start_deadline_filter(at: datetime) -> Q:
    """``past_start_deadline`` as a query: the runs whose start deadline comes before
    ``at`` (none without one). ``too_late_to_start`` and fleet.py's skip read it."""
    return Q(start_deadline__lt=at)


# The runs a deadline watches: unfinished, with a deadline to finish, not found late yet.
# The condition of their index (periodic_run_deadline), which the watcher reads alone.
DEADLINE_WATCHED = Q(finish_by__isnull=False, late_at__isnull=True, status__in=ACTIVE_STATUSES)


def past_finish_by(at: datetime) -> Q:
    """The watched runs whose deadline to finish came before ``at``: late, to be flagged
    (engine/runs/deadlines.py; the PostgreSQL statement is built from this)."""
    return DEADLINE_WATCHED & Q(finish_by__lt=at)


# When a run may first start: its plan time, or later by its schedule's stagger
# (release_at). Claims, the look ahead and lag read it; the claim index holds it. Run's
# release_time says it of one run, pg_claims.RELEASE in the claim statement (tests/
# test_rules.py checks both agree with it); other statements compile it
# (engine/backends/postgresql/rules.py).
RELEASE = Coalesce("release_at", "plan_time")


# A fire recorded skipped (missed, paused, closed, ...) is final as it is recorded: it is
# finished then, and a run recorded in any other status is not. The planner's ORM path
# reads finished_when_recorded, its statement (engine/planning/recording.py) these statuses.
FINISHED_WHEN_RECORDED = (choices.RunStatus.SKIPPED,)


def finished_when_recorded(status: str, now: datetime) -> datetime | None:
    """The ``finished_at`` of a run recorded at ``now`` in ``status``."""
    return now if status in FINISHED_WHEN_RECORDED else None


# What a run keeps of its schedule when it is recorded, run field: schedule field. It calls
# this whatever the schedule becomes; a retry repeats it. The planner's statement copies
# the same columns (engine/planning/recording.py builds its SQL from this).
SNAPSHOT_FIELDS = {
    "job_name": "job",
    "args": "args",
    "kwargs": "kwargs",
    "schedule_revision": "revision",
}


# The fields a new run copies from its schedule as they are, run field: schedule field: the
# snapshot, and how many attempts it may make. The planner's statement copies the same
# columns (engine/planning/recording.py builds its SQL from this).
COPIED_FROM_SCHEDULE = {
    **SNAPSHOT_FIELDS,
    "max_attempts": "max_attempts",
    "concurrency_limit_id": "concurrency_limit_id",
}


class NewRunSource(Protocol):
    """What a new run reads of its schedule: a ``Schedule``, or a due row the planner loaded."""

    @property
    def job(self) -> str: ...
    @property
    def args(self) -> Any: ...
    @property
    def kwargs(self) -> Any: ...
    @property
    def revision(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def tasks_backend(self) -> str: ...
    @property
    def overlap(self) -> str: ...
    @property
    def concurrency_limit_id(self) -> int | None: ...


def taken_from_schedule(schedule: NewRunSource) -> dict[str, Any]:
    """The fields a new run takes from its schedule, whatever records it: those it copies
    (``COPIED_FROM_SCHEDULE``), where it executes (``conf.tasks_backend_for``) and whether
    it holds the schedule's one active slot (``policies.is_exclusive``).

    ``Run.for_schedule`` and the planner's ORM path read it; the planner's statement and
    backfill's are built from it or checked against it (tests/test_rules.py)."""
    return {
        **{field: getattr(schedule, of) for field, of in COPIED_FROM_SCHEDULE.items()},
        "tasks_backend": tasks_backend_for(schedule.tasks_backend),
        "exclusive": policies.is_exclusive(schedule.overlap),
    }


class RunQuerySet(models.QuerySet["Run"]):
    def active(self) -> "RunQuerySet":
        """Runs not yet final: waiting or running."""
        return self.filter(status__in=Run.ACTIVE_STATUSES)

    def waiting(self) -> "RunQuerySet":
        """Runs that have not started (or not restarted): pending, queued or retrying."""
        return self.filter(status__in=Run.WAITING_STATUSES)

    def finished(self) -> "RunQuerySet":
        """Runs in a final state: succeeded, failed, skipped or cancelled."""
        return self.filter(status__in=Run.FINAL_STATUSES)

    def running(self) -> "RunQuerySet":
        """Runs executing now, under a lease."""
        return self.filter(status=Run.Status.RUNNING)

    def failed(self) -> "RunQuerySet":
        """Runs that ended failed."""
        return self.filter(status=Run.Status.FAILED)

    def late(self) -> "RunQuerySet":
        """Runs found unfinished past their deadline (``Schedule.finish_within``), whatever
        became of them after."""
        return self.filter(late_at__isnull=False)

    def cancel(self, now: datetime | None = None) -> tuple[int, int]:
        """Cancel these runs that have not started, and ask running ones to stop (their
        context's ``cancelled`` turns true). Returns (cancelled, asked to stop); see
        docs/semantics.md ("Cancel")."""
        cancelled: tuple[int, int] = db.ledger(self.db).cancel(self, now or clock.now(self.db))
        return cancelled

    def claimable(self, now: datetime) -> "RunQuerySet":
        """Runs a worker may start now: pending ones released (``RELEASE``), and retries
        whose delay has passed (a retry never comes before its release).
        ``pg_claims.CLAIMABLE_NOW`` says the same in SQL."""
        due = Q(status__in=CLAIMABLE_STATUSES, release__lte=now)
        ready = Q(status=Run.Status.PENDING) | Q(next_retry_at__lte=now)
        return self.alias(release=RELEASE).filter(due & ready).order_by(RELEASE, "pk")

    def too_late_to_start(self, now: datetime) -> "RunQuerySet":
        """Runs not started yet whose start deadline passed before ``now``: to be skipped
        (``Run.too_late_to_start``; the PostgreSQL claim's SQL is built from this)."""
        return self.filter(past_start_deadline_filter(now), **NOT_STARTED_VALUES)

    def executed_here(self) -> "RunQuerySet":
        """Runs that ``run_scheduler``'s own workers execute (none handed to a tasks backend)."""
        return self.filter(tasks_backend="")

    def of_jobs(self, jobs: "Collection[str]") -> "RunQuerySet":
        """Runs of these jobs, of a ledger format this release reads: a process claims only
        runs whose job its code registers and whose format it reads (engine/fleet.py).
        ``pg_claims.OF_JOBS`` says the same in SQL."""
        return self.filter(job_name__in=jobs, ledger_format__lte=choices.LEDGER_FORMAT)

    def handed_off(self) -> "RunQuerySet":
        """Runs that a tasks backend's workers execute (``Schedule.tasks_backend``)."""
        return self.exclude(tasks_backend="")

    def coming(self, now: datetime, ahead: timedelta) -> "RunQuerySet":
        """Pending runs planned ahead, released within ``ahead`` of ``now`` but not yet
        (``pg_claims.CLAIMABLE_AHEAD`` in SQL)."""
        pending = self.alias(release=RELEASE).filter(status=Run.Status.PENDING)
        soon = pending.filter(release__gt=now, release__lte=now + ahead)
        return soon.order_by(RELEASE, "pk")


class Run(models.Model):
    """One firing of a schedule and its outcome; one row per (schedule, plan time)."""

    Status = choices.RunStatus
    Trigger = choices.RunTrigger

    WAITING_STATUSES = choices.WAITING_STATUSES
    ACTIVE_STATUSES = choices.ACTIVE_STATUSES
    FINAL_STATUSES = choices.FINAL_STATUSES
    SLOT_STATUSES = choices.SLOT_STATUSES
    CLAIMABLE_STATUSES = choices.CLAIMABLE_STATUSES

    # Indexed by periodic_run_history (schedule, -plan_time); a second index costs every insert.
    schedule = models.ForeignKey(
        "django_periodic.Schedule", on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    plan_time = models.DateTimeField(help_text=_("The nominal fire time (UTC)."))
    release_at = models.DateTimeField(
        _("release time"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("When it may start, staggered by its schedule's jitter; empty: its plan time."),
    )
    scope = models.CharField(
        max_length=scope_providers.KEY_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text=_("The scope key of a fanned-out fire; empty for an unscoped run."),
    )
    # Why it was recorded, its origin (a fire of the schedule, manual, a retry, a backfill):
    # not the schedule's trigger (its cron, interval or run_at).
    trigger = models.CharField(
        max_length=16, choices=Trigger, default=Trigger.SCHEDULE, db_default=Trigger.SCHEDULE
    )
    schedule_revision = models.PositiveIntegerField(
        _("revision"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("The schedule's revision that planned it; empty if recorded before revisions."),
    )
    status = models.CharField(
        max_length=16, choices=Status, default=Status.PENDING, db_default=Status.PENDING
    )
    attempt = models.PositiveIntegerField(default=0, db_default=0)
    max_attempts = models.PositiveIntegerField(default=1, db_default=1)
    interruptions = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text=_("Attempts cut short because their process died or stopped."),
    )
    exclusive = models.BooleanField(
        default=True,
        db_default=True,
        editable=False,
        help_text=_("Counts as its schedule's one active run (overlap is not “concurrent”)."),
    )
    start_deadline = models.DateTimeField(
        null=True, blank=True, help_text=_("Skipped if not started by then.")
    )
    # Copied from its schedule when recorded (models/limits.py): while held, release_at is
    # limits.HELD and its real release waits here.
    concurrency_limit = models.ForeignKey(
        "django_periodic.ConcurrencyLimit",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="runs",
        db_index=False,
        editable=False,
    )
    held_release_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("While it waits for its concurrency limit: when it may start once admitted."),
    )
    admitted_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("When its concurrency limit gave it a slot; empty: it did not wait for one."),
    )
    ledger_format = ledger_format_field()
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Its deadline (engine/runs/deadlines.py): its plan time plus its schedule's
    # finish_within when it was recorded; late_at when it was found unfinished past it.
    finish_by = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("Late if not finished by then; empty: no deadline."),
    )
    late_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("When it was found unfinished past its deadline; empty: never."),
    )
    next_retry_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.DurationField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text=_("Why it failed or was skipped, machine-readable."),
    )
    error_message = models.TextField(blank=True, default="", db_default="")
    traceback = models.TextField(blank=True, default="", db_default="")
    job_name = models.CharField(max_length=200)
    args = models.JSONField(default=list, db_default=[])
    kwargs = models.JSONField(default=dict, db_default={})
    tasks_backend = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("The TASKS backend that executes it; empty: run_scheduler's own workers."),
    )
    task_id = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("Its task in that backend."),
    )
    enqueued_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text=_("When its task was last enqueued.")
    )
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now(), editable=False)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-plan_time", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "scope", "plan_time"],
                condition=Q(trigger__in=choices.LEDGER_TRIGGERS),
                name="periodic_run_once_per_plan_time",
            ),
            # The database, not only the planner, keeps a second exclusive run of a schedule
            # (and scope) from starting.
            models.UniqueConstraint(
                fields=["schedule", "scope"],
                condition=Q(exclusive=True, status__in=choices.SLOT_STATUSES),
                name="periodic_run_one_active",
            ),
        ]
        indexes = [
            models.Index(fields=["schedule", "-plan_time"], name="periodic_run_history"),
            # The whole history by plan time: the admin's run list, prune_runs' cutoff.
            models.Index(fields=["-plan_time", "-id"], name="periodic_run_plan_time"),
            # Runs our workers may claim, in the claim's order: no sort, and no other index
            # cheaper to the planner when a burst has left its statistics stale.
            models.Index(
                RELEASE,
                F("id"),
                condition=Q(status__in=CLAIMABLE_STATUSES, tasks_backend=""),
                name="periodic_run_claimable",
            ),
            # Handed-off runs without a task yet: the first released, to enqueue.
            models.Index(
                RELEASE,
                condition=Q(status__in=CLAIMABLE_STATUSES, enqueued_at__isnull=True)
                & ~Q(tasks_backend=""),
                name="periodic_run_to_enqueue",
            ),
            # What each scope has in flight (occupancy) and its oldest queued run (promotion),
            # without reading the runs of a fanned-out schedule's other scopes.
            models.Index(
                fields=["schedule", "scope"],
                condition=Q(status__in=choices.ACTIVE_STATUSES),
                name="periodic_run_active",
            ),
            # Unfinished runs with a deadline not yet found late: what the deadline watcher
            # reads (engine/runs/deadlines.py), earliest first. Partial: a run without a
            # deadline writes nothing to it, and an idle watcher reads an empty range.
            models.Index(
                fields=["finish_by"],
                condition=DEADLINE_WATCHED,
                name="periodic_run_deadline",
            ),
            # Runs waiting for their concurrency limit, oldest plan time first (admission),
            # and those holding its slots: what engine/runs/limits.py reads, and nothing
            # for a run of a schedule without a limit.
            models.Index(
                fields=["concurrency_limit", "plan_time"],
                condition=limits.WAITING,
                name="periodic_run_held",
            ),
            models.Index(
                fields=["concurrency_limit", "scope"],
                condition=limits.HOLDING & Q(concurrency_limit__isnull=False),
                name="periodic_run_limited",
            ),
            # Handed-off runs waiting for their task: the oldest enqueue, to redeliver.
            models.Index(
                fields=["enqueued_at"],
                condition=Q(enqueued_at__isnull=False, status__in=CLAIMABLE_STATUSES),
                name="periodic_run_enqueued",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} @ {self.plan_time:%Y-%m-%d %H:%M:%S} ({self.status})"

    @property
    def awaits_release(self) -> bool:
        """A backfilled run that has not started: it waits for its release time
        (``next_retry_at``), paced by the backfill's rate (``AWAITING_RELEASE``)."""
        return all(getattr(self, name) == value for name, value in AWAITING_RELEASE_VALUES.items())

    def too_late_to_start(self, now: datetime) -> bool:
        """Not started yet, and past its start deadline at ``now``: it is skipped instead
        (``RunQuerySet.too_late_to_start``)."""
        not_started = all(getattr(self, name) == v for name, v in NOT_STARTED_VALUES.items())
        return not_started and past_start_deadline(self.start_deadline, now)

    @property
    def release_time(self) -> datetime:
        """When it may first start: its plan time, or later by its schedule's stagger
        (``RELEASE``, as a query)."""
        return self.release_at or self.plan_time

    @property
    def snapshot(self) -> dict[str, Any]:
        """What this run calls, as taken from its schedule (``SNAPSHOT_FIELDS``)."""
        return {field: getattr(self, field) for field in SNAPSHOT_FIELDS}

    @classmethod
    def for_schedule(cls, schedule: ScheduleFields, plan_time: datetime, **fields: Any) -> "Run":
        """An unsaved run of ``schedule`` with what it takes from it
        (``taken_from_schedule``: a snapshot of what it will call, ...); ``fields`` set the
        rest, or override them."""
        deadline = policies.finish_by(plan_time, schedule.finish_within)
        fields = limits.hold({**taken_from_schedule(schedule), "finish_by": deadline, **fields})
        # ``schedule`` is a Schedule, the model the key names (``ScheduleFields`` is its base).
        return cls(schedule=schedule, plan_time=plan_time, **fields)  # type: ignore[misc]
