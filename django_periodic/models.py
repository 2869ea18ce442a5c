"""The ledger: schedules, the runs they fire, and the leases under which runs execute."""

import copy
import uuid
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, Self

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, models, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber
from django.utils.translation import gettext_lazy as _

from django_periodic import (
    arrays,
    bounds,
    choices,
    clock,
    policies,
    registry,
    signals,
    taskbackends,
    triggers,
    wakeups,
)
from django_periodic import scopes as scope_providers
from django_periodic.choices import ErrorCode, ScheduleKind
from django_periodic.conf import get_settings, tasks_backend_for

if TYPE_CHECKING:
    from django_periodic.backfill import BackfillResult

# Schedule fields by role: the admin's form and fieldsets, @job and the sync use these.
JOB_FIELDS = ("args", "kwargs", "scopes")
TRIGGER_FIELDS = ("cron", "timezone", "interval", "run_at", "start_at", "end_at")
POLICY_FIELDS = (
    "overlap",
    "max_queued",
    "max_concurrent",
    "misfire",
    "misfire_grace",
    "max_attempts",
    "retry_backoff",
    "timeout",
    "lease_timeout",
    "allow_stale_reentry",
    "tasks_backend",
)
# How long a schedule's finished runs are kept (retention.py); empty: the global settings.
RETENTION_FIELDS = ("keep_runs", "keep_runs_for", "keep_failed_runs_for")
# What @job(...) may define besides its name: every field above.
SCHEDULE_OPTIONS = frozenset(JOB_FIELDS + TRIGGER_FIELDS + POLICY_FIELDS + RETENTION_FIELDS)
# Fields whose change moves a schedule's cursor (next_fire_at) when saved.
CURSOR_FIELDS = (*TRIGGER_FIELDS, "enabled")
# Fields whose change makes a new revision of a schedule (Schedule.revision): what its
# runs call, and when.
REVISION_FIELDS = ("job", *JOB_FIELDS, *TRIGGER_FIELDS)


def _copy_if_mutable(value: Any) -> Any:
    if isinstance(value, list | dict):
        return copy.deepcopy(value) if value else type(value)()  # most args are empty
    return value


# The field that carries each kind of trigger (keyed by Schedule.Kind, or its plain str value).
KIND_FIELDS: dict[str, str] = {
    ScheduleKind.CRON: "cron",
    ScheduleKind.INTERVAL: "interval",
    ScheduleKind.ONCE: "run_at",
}
# The same rule in SQL: which rows are of each kind (cron wins, then interval, then run_at).
_KIND_FILTERS = {
    ScheduleKind.CRON: ~Q(cron=""),
    ScheduleKind.INTERVAL: Q(cron="", interval__isnull=False),
    ScheduleKind.ONCE: Q(cron="", interval__isnull=True, run_at__isnull=False),
}


class TriggerRow(Protocol):
    """The columns a trigger is built from: a ``Schedule``, or a due row the planner loaded."""

    @property
    def cron(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def interval(self) -> timedelta | None: ...
    @property
    def run_at(self) -> datetime | None: ...
    @property
    def start_at(self) -> datetime | None: ...
    @property
    def end_at(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime | None: ...


def kind_of(row: TriggerRow) -> str:
    """The ``Schedule.Kind`` of a row's trigger ("" if none is set)."""
    if row.cron:
        return ScheduleKind.CRON
    if row.interval is not None:
        return ScheduleKind.INTERVAL
    return ScheduleKind.ONCE if row.run_at is not None else ""


def trigger_of(row: TriggerRow) -> triggers.Trigger:
    """The fire times of a row as a pure trigger: the one place where a row becomes one.

    Raises InvalidTrigger for a bad row, however it was stored: no trigger, an invalid cron
    or time zone, a time out of range, an interval shorter than the MIN_INTERVAL setting.
    """
    errors = trigger_field_errors(row)
    if errors:
        raise triggers.InvalidTrigger(" ".join(message for _, message in errors))
    kind = kind_of(row)
    inner: triggers.Trigger
    if kind == ScheduleKind.CRON:
        inner = triggers.cron(row.cron, row.timezone)
    elif kind == ScheduleKind.INTERVAL:
        assert row.interval is not None  # what makes the kind INTERVAL
        anchor = row.start_at or row.created_at
        if anchor is None:
            raise triggers.InvalidTrigger("An interval needs its anchor: start_at or created_at.")
        inner = triggers.IntervalTrigger(row.interval, anchor)
    elif kind == ScheduleKind.ONCE:
        assert row.run_at is not None  # what makes the kind ONCE
        inner = triggers.OnceTrigger(row.run_at)
    else:
        raise triggers.InvalidTrigger("A schedule needs a cron, an interval or a run_at.")
    return triggers.BoundedTrigger(inner, row.start_at, row.end_at)


def first_fire_time_of(row: TriggerRow, now: datetime) -> datetime | None:
    """The cursor of a new or re-triggered schedule: the first fire after ``now``.

    A one-shot keeps its ``run_at`` even when it has passed: firing late or not
    is the misfire policy's decision, and it must not vanish silently.
    """
    trigger = trigger_of(row)
    if kind_of(row) == ScheduleKind.ONCE:
        assert row.run_at is not None  # what makes the kind ONCE
        return trigger.next_after(row.run_at - timedelta(microseconds=1))
    return trigger.next_after(now)


# The bounded fields a trigger is built from (bounds.SCHEDULE holds their ranges).
_BOUNDED_TRIGGER_FIELDS = ("run_at", "start_at", "end_at")


def trigger_field_errors(row: TriggerRow) -> list[tuple[str, str]]:
    """(field, message) for each trigger field of ``row`` out of its range: a time outside
    [bounds.EARLIEST, bounds.LATEST), an interval outside its range or below MIN_INTERVAL."""
    errors = []
    for name in _BOUNDED_TRIGGER_FIELDS:
        message = bounds.SCHEDULE[name].error(name, getattr(row, name))
        if message:
            errors.append((name, message))
    message = None if row.interval is None else _interval_error(row.interval)
    return [*errors, ("interval", message)] if message else errors


def _interval_error(interval: timedelta) -> str | None:
    if interval <= timedelta(0):
        return "The interval must be positive."
    # A setting, so that a deployment can ask for more than the database's floor; a row
    # below it that was stored anyway (or before it was raised) is refused here.
    minimum = get_settings().MIN_INTERVAL
    if interval < minimum:
        shown, least = bounds.show(interval), bounds.show(minimum)
        return f"The interval ({shown}) must be at least MIN_INTERVAL ({least})."
    return bounds.SCHEDULE["interval"].error("interval", interval)


def _range_constraints() -> list[models.CheckConstraint]:
    """One CHECK per field of bounds.SCHEDULE: no path (``update()``, ``bulk_create()``, raw
    SQL) stores a value out of its range. NULL passes a CHECK: an empty field is allowed
    where the field is nullable."""
    constraints = []
    for name, valid in bounds.SCHEDULE.items():
        low = f"{name}__gt" if valid.low_open else f"{name}__gte"
        high = f"{name}__lt" if valid.high_open else f"{name}__lte"
        constraints.append(
            models.CheckConstraint(
                condition=Q(**{low: valid.low, high: valid.high}),
                name=f"periodic_schedule_{name}_range",
            )
        )
    return constraints


def default_timezone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or "UTC"


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def enabled(self) -> "ScheduleQuerySet":
        """Schedules the planner looks at (not paused or disabled)."""
        return self.filter(enabled=True)

    def of_kind(self, kind: str) -> "ScheduleQuerySet":
        """Schedules whose trigger is of this ``Schedule.Kind``."""
        return self.filter(_KIND_FILTERS[ScheduleKind(kind)])

    def due(self, now: datetime) -> "ScheduleQuerySet":
        """Enabled schedules whose cursor has reached ``now``, the most overdue first."""
        return self.filter(enabled=True, next_fire_at__lte=now).order_by("next_fire_at", "pk")

    def update(self, **kwargs: Any) -> int:
        """Update these rows; writing any of ``REVISION_FIELDS`` bumps their revision.

        Bumped in the same statement, changed value or not (the database would have to
        compare every field to tell), so ``bulk_update()`` of those fields bumps too.
        """
        if "revision" not in kwargs and not kwargs.keys().isdisjoint(REVISION_FIELDS):
            kwargs["revision"] = F("revision") + 1
        return super().update(**kwargs)

    def reschedule(self, now: datetime | None = None) -> int:
        """Recompute the cursor of these schedules from ``now`` (after edits that bypass save())."""
        now = now or clock.now(self.db)
        changed = []
        for schedule in self.iterator():
            if schedule.trigger_kind == ScheduleKind.ONCE and schedule.next_fire_at is None:
                continue  # a fired one-shot stays fired
            schedule.next_fire_at = schedule.first_fire_time(now)
            changed.append(schedule)
        updated = self.model.objects.using(self.db).bulk_update(changed, ["next_fire_at"])
        if updated:
            wakeups.notify(self.db)
        return updated


class Schedule(models.Model):
    """When and how a registered job runs; exactly one trigger: cron, interval or run_at."""

    Kind = ScheduleKind

    Overlap = choices.Overlap
    Misfire = choices.Misfire

    name = models.CharField(max_length=200)  # unique: see Meta.constraints
    job = models.CharField(max_length=200, help_text=_("Name of a registered @job."))
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    scopes = models.CharField(
        max_length=200,
        blank=True,
        help_text=_("A registered scope provider: each fire runs once per scope key it returns."),
    )

    cron = models.CharField(max_length=200, blank=True, help_text=_("5-field cron or @daily."))
    timezone = models.CharField(max_length=64, default=default_timezone)
    interval = models.DurationField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True, help_text=_("Fire once at this time."))
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)

    enabled = models.BooleanField(default=True)
    overlap = models.CharField(max_length=16, choices=Overlap, default=Overlap.SKIP)
    max_queued = models.PositiveIntegerField(
        default=1, help_text=_("With overlap “queue”: fires that may wait; more are skipped.")
    )
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("With overlap “concurrent”: most runs active at once; empty for no limit."),
    )
    misfire = models.CharField(max_length=16, choices=Misfire, default=Misfire.LATEST)
    misfire_grace = models.DurationField(default=timedelta(minutes=1))
    max_attempts = models.PositiveIntegerField(default=1)
    retry_backoff = models.DurationField(
        default=timedelta(seconds=10), help_text=_("Delay before the first retry; doubles after.")
    )
    timeout = models.DurationField(null=True, blank=True)
    lease_timeout = models.DurationField(default=timedelta(seconds=30))
    allow_stale_reentry = models.BooleanField(
        default=False,
        help_text=_("Run again when the process running it died (at-least-once)."),
    )
    tasks_backend = models.CharField(
        max_length=100,
        blank=True,
        help_text=_(
            "A TASKS backend alias whose workers execute its runs; empty: the "
            "DJANGO_PERIODIC TASKS_BACKEND setting (none: run_scheduler's own workers)."
        ),
    )

    keep_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Keep at least its last N finished runs; empty: the KEEP_RUNS setting."),
    )
    keep_runs_for = models.DurationField(
        null=True,
        blank=True,
        help_text=_("Keep finished runs planned this recently; empty: the KEEP_RUNS_FOR setting."),
    )
    keep_failed_runs_for = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "Keep failed runs planned this recently; empty: the KEEP_FAILED_RUNS_FOR setting."
        ),
    )

    revision = models.PositiveIntegerField(
        default=1,
        editable=False,
        help_text=_("Bumped when its trigger, job or arguments change; each run records it."),
    )
    # The cursor; NULL: no next fire. A row stored without save() gets UNPLANNED from the
    # database, and is planned from its trigger (is_unplanned).
    next_fire_at = models.DateTimeField(
        null=True, blank=True, editable=False, db_default=bounds.UNPLANNED
    )
    last_error = models.TextField(blank=True, editable=False)
    planning_failures = models.PositiveIntegerField(
        default=0, editable=False, help_text=_("Consecutive ticks that could not plan it.")
    )
    defined_in = models.CharField(
        max_length=300, blank=True, editable=False, help_text=_("Code location of a @job schedule.")
    )
    created_at = models.DateTimeField(default=clock.wall_now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            # A constraint, not unique=True, which on PostgreSQL adds a varchar_pattern_ops
            # index for LIKE 'prefix%' that no query here uses, and that every cursor move
            # (a non-HOT update) had to write: one index in four.
            models.UniqueConstraint(fields=["name"], name="periodic_schedule_name_unique"),
            *_range_constraints(),
        ]
        indexes = [
            # In due()'s order (cursor, then id), so a batch reads its rows off the index;
            # on the cursor alone every batch sorted every due row to take the first ones.
            models.Index(
                fields=["next_fire_at", "id"],
                condition=Q(enabled=True),
                name="periodic_schedule_due",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    # The trigger fields as loaded or last saved (see from_db); absent on a new instance.
    _loaded_trigger: dict[str, Any]
    # The revision fields likewise (deferred ones left out: reading them would query).
    _loaded_revision: dict[str, Any]

    def save(self, *args: Any, **kwargs: Any) -> None:
        update_fields = kwargs.get("update_fields")
        touches_trigger = update_fields is None or set(update_fields) & set(CURSOR_FIELDS)
        moved = touches_trigger and self._move_cursor(kwargs.get("using") or "default")
        if moved and update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "next_fire_at"}
        revised = self._revised(update_fields)
        if revised:
            # In the UPDATE itself, so that two concurrent edits make two revisions.
            self.revision = F("revision") + 1
            if update_fields is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "revision"}
        super().save(*args, **kwargs)
        if revised:
            saved = Schedule.objects.using(self._state.db).filter(pk=self.pk)
            self.revision = saved.values_list("revision", flat=True).get()
        self._loaded_trigger = self._saved(self._trigger_state(), "_loaded_trigger", update_fields)
        self._loaded_revision = self._saved(
            self._revision_state(), "_loaded_revision", update_fields
        )
        if moved:
            # Sleeping schedulers look at the new cursor.
            wakeups.notify(self._state.db or "default")

    def _move_cursor(self, using: str) -> bool:
        """Set ``next_fire_at`` after a change that affects it; return whether it moved.

        A new schedule, an edited trigger and a resumed schedule restart from now (time
        spent paused is not a misfire). Pausing keeps the cursor, and a one-shot keeps it
        unless ``run_at`` changed, so that a fired one-shot can never fire again.
        """
        loaded = getattr(self, "_loaded_trigger", None) or {}
        current = self._trigger_state()
        missing = object()  # deferred when loaded, set since: counts as a change
        changed = {name for name in current if loaded.get(name, missing) != current[name]}
        if not self._state.adding:
            if not changed or (changed == {"enabled"} and not self.enabled):
                return False
            if self.trigger_kind == ScheduleKind.ONCE and "run_at" not in changed:
                return False
        now = clock.now(using)
        if self._state.adding:
            self.created_at = now  # an interval's anchor: the database's clock, like all times
        self.next_fire_at = self.first_fire_time(now)
        return True

    def _saved(
        self, current: dict[str, Any], loaded: str, update_fields: Iterable[str] | None
    ) -> dict[str, Any]:
        """The values as stored now: those written, the loaded ones for the others."""
        if update_fields is None:
            return current
        written = {k: v for k, v in current.items() if k in set(update_fields)}
        return {**getattr(self, loaded, {}), **written}

    def _revised(self, update_fields: Iterable[str] | None) -> bool:
        """Whether this save writes a new value to one of ``REVISION_FIELDS``."""
        if self._state.adding:
            return False
        loaded = getattr(self, "_loaded_revision", {})
        written = REVISION_FIELDS if update_fields is None else set(update_fields)
        missing = object()  # deferred when loaded, set since: counts as a change
        current = self._revision_state()
        return any(
            loaded.get(name, missing) != current[name]
            for name in REVISION_FIELDS
            if name in written and name in current
        )

    def _revision_state(self) -> dict[str, Any]:
        # Copies of args and kwargs, which may be changed in place; the other fields hold
        # immutable values. Every claimed run loads its schedule: this stays cheap.
        return {
            name: _copy_if_mutable(self.__dict__[name])
            for name in REVISION_FIELDS
            if name in self.__dict__
        }

    @classmethod
    def from_db(
        cls,
        db: str | None,
        field_names: Collection[str],
        values: Collection[Any],
        *args: Any,
        **kwargs: Any,
    ) -> Self:
        instance = super().from_db(db, field_names, values, *args, **kwargs)
        instance._loaded_trigger = instance._trigger_state()
        instance._loaded_revision = instance._revision_state()
        return instance

    def _trigger_state(self) -> dict[str, Any]:
        # Deferred fields are left out: reading one would load the instance again.
        return {name: self.__dict__[name] for name in CURSOR_FIELDS if name in self.__dict__}

    @property
    def trigger_kind(self) -> str:
        """The ``Schedule.Kind`` of the trigger ("" if none is set)."""
        return kind_of(self)

    @property
    def is_unplanned(self) -> bool:
        """Stored without save() (``bulk_create()``, raw SQL, a fixture): its cursor is the
        database's default, ``bounds.UNPLANNED``, until the planner plans it from its trigger."""
        return self.next_fire_at == bounds.UNPLANNED

    @property
    def is_code_defined(self) -> bool:
        return bool(self.defined_in)

    @property
    def trigger(self) -> triggers.Trigger:
        """The schedule's fire times as a pure trigger; raises InvalidTrigger for a bad row."""
        return trigger_of(self)

    def first_fire_time(self, now: datetime) -> datetime | None:
        """The cursor of a new or re-triggered schedule: the first fire after ``now``
        (``first_fire_time_of``)."""
        return first_fire_time_of(self, now)

    def next_fire_times(self, n: int, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` fire times strictly after ``after`` (default: now), aware UTC."""
        return triggers.fire_times(self.trigger, n, after or clock.wall_now())

    def run_now(self, scope: str = "") -> "Run":
        """Record a manual run for a scheduler to execute; never runs the job in this thread.

        On a fanned-out schedule (``scopes`` set), ``scope`` names the scope key to run for;
        ``run_now_for_all_scopes()`` runs every key the provider returns.
        """
        if self.scopes and not scope:
            raise ValueError(
                f"Schedule {self.name!r} is fanned out per scope ({self.scopes}): name the "
                "scope key to run for, or run all of them (run_now_for_all_scopes())."
            )
        now = clock.now(self._state.db or "default")
        return self.plan_extra_run(now, trigger=Run.Trigger.MANUAL, plan_time=now, scope=scope)

    def run_now_for_all_scopes(self) -> list["Run"]:
        """Record manual runs as a fire would: one per scope key of a fanned-out schedule
        (its provider is called here, before any row is locked), else ``run_now()``'s one."""
        if not self.scopes:
            return [self.run_now()]
        keys = scope_providers.scope_keys(self.scopes)
        now = clock.now(self._state.db or "default")
        return self.plan_extra_runs(now, trigger=Run.Trigger.MANUAL, plan_time=now, scopes=keys)

    def backfill(
        self,
        start: datetime,
        end: datetime,
        *,
        rate: float | None = None,
        now: datetime | None = None,
    ) -> "BackfillResult":
        """Record a run (trigger ``backfill``) for each plan time of the trigger in
        ``[start, end)`` that has no run yet, one per scope key on a fanned-out schedule.

        Only past plan times are recorded (``end`` is clamped to the database's clock);
        the cursor does not move. Runs wait until released ``rate`` per second (default
        ``backfill.DEFAULT_RATE``), after the schedule's runs already waiting from an earlier
        backfill. Raises ValueError for a bad range, or more than ``backfill.MAX_RUNS`` runs.
        See docs/backfill.md.
        """
        from django_periodic import backfill

        rate = backfill.DEFAULT_RATE if rate is None else rate
        return backfill.backfill(self, start, end, rate=rate, now=now)

    def plan_extra_run(
        self, now: datetime, *, trigger: str, plan_time: datetime, scope: str = "", **snapshot: Any
    ) -> "Run":
        """Record a run outside the trigger's plan times (manual, retry) under the overlap
        policy of its scope, like any fire. ``snapshot`` may override the job name,
        arguments and revision (a retry repeats what the failed run called).
        """
        runs = self.plan_extra_runs(
            now, trigger=trigger, plan_time=plan_time, scopes=[scope], **snapshot
        )
        return runs[0]

    def plan_extra_runs(
        self,
        now: datetime,
        *,
        trigger: str,
        plan_time: datetime,
        scopes: list[str],
        **snapshot: Any,
    ) -> list["Run"]:
        """Record one extra run per scope key, each under its scope's overlap policy.

        The decisions are taken on the schedule row as locked now (the planner holds the
        same lock while it decides), never on this instance, which may be stale.
        """
        using = self._state.db or "default"
        with transaction.atomic(using=using):
            locked = Schedule.objects.using(using).select_for_update().get(pk=self.pk)
            runs = Run.objects.using(using)
            occupancy = runs.occupancy([locked.pk])
            new, superseded = [], []
            for scope in scopes:
                in_flight = occupancy.get((locked.pk, scope), policies.Occupancy())
                status, reason = policies.overlap_status(locked, in_flight)
                if in_flight.retrying and status != Run.Status.SKIPPED:
                    superseded.append(scope)
                run = Run.for_schedule(
                    locked, plan_time, trigger=trigger, status=status, error_code=reason, **snapshot
                )
                run.scope, run.created_at = scope, now
                if status == Run.Status.SKIPPED:
                    run.finished_at = now
                new.append(run)
            if superseded:
                runs.filter(schedule=locked, scope__in=superseded).supersede_retries(now)
            created = runs.bulk_create(new)
            if any(run.status == Run.Status.PENDING for run in created):
                wakeups.notify(using)
            if signals.listened(signals.run_planned, signals.run_skipped):
                signals.send_on_commit(map(signals.recorded, created), using)
        return created

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        found = self._trigger_errors() + self._job_errors() + self._route_errors()
        for field, message in found + self._range_errors():
            errors.setdefault(field, []).append(message)
        if errors:
            raise ValidationError(errors)

    def validate_constraints(self, exclude: Collection[str] | None = None) -> None:
        # clean() checks the ranges of bounds.SCHEDULE, the CHECK constraints' own, with a
        # message on the field; Django would run one query per CHECK to say it again.
        super().validate_constraints(exclude={*(exclude or ()), *bounds.SCHEDULE})

    def _trigger_errors(self) -> list[tuple[str, str]]:
        kinds = [name for name in KIND_FIELDS.values() if getattr(self, name) not in ("", None)]
        if len(kinds) != 1:
            which = " and ".join(kinds) if kinds else "none"
            message = f"Set exactly one trigger: cron, interval or run_at (got {which})."
            return [(kinds[0] if kinds else "cron", message)]
        errors = []
        try:
            triggers.parse_timezone(self.timezone)
        except triggers.InvalidTrigger as exc:
            errors.append(("timezone", str(exc)))
        if self.cron:
            try:
                triggers.validate_cron(self.cron)
            except triggers.InvalidTrigger as exc:
                errors.append(("cron", str(exc)))
        out_of_range = trigger_field_errors(self)
        errors += out_of_range
        compared = not {"start_at", "end_at"} & {field for field, _ in out_of_range}
        start, end = self.start_at, self.end_at
        if compared and start and end and end <= start:
            errors.append(("end_at", "end_at must be after start_at."))
        return errors

    def _range_errors(self) -> list[tuple[str, str]]:
        """Fields out of their range (bounds.SCHEDULE); the trigger's are checked with it."""
        errors = []
        for name, valid in bounds.SCHEDULE.items():
            if name in TRIGGER_FIELDS:
                continue  # checked with the trigger, as when one is built (trigger_field_errors)
            message = valid.error(name, getattr(self, name))
            if message:
                errors.append((name, message))
        heartbeat = get_settings().HEARTBEAT_INTERVAL
        lease_timeout = self.lease_timeout
        if lease_timeout is not None and timedelta(0) < lease_timeout < 2 * heartbeat:
            message = (
                f"lease_timeout must be at least twice the heartbeat interval ({heartbeat}), "
                "or a live process could lose its lease."
            )
            errors.append(("lease_timeout", message))
        return errors

    def _route_errors(self) -> list[tuple[str, str]]:
        error = self.tasks_backend and taskbackends.alias_error(self.tasks_backend)
        return [("tasks_backend", error)] if error else []

    def _job_errors(self) -> list[tuple[str, str]]:
        errors = []
        if self.scopes:
            try:
                scope_providers.get_provider(self.scopes)
            except scope_providers.UnknownProvider as exc:
                errors.append(("scopes", str(exc)))
        if not isinstance(self.args, list):
            errors.append(("args", 'args must be a JSON list, e.g. [1, "two"].'))
        if not isinstance(self.kwargs, dict):
            errors.append(("kwargs", 'kwargs must be a JSON object, e.g. {"key": "value"}.'))
        try:
            registered = registry.get_job(self.job)
        except registry.UnknownJob as exc:
            return [*errors, ("job", str(exc))]
        if self.scopes and not registered.takes_context:
            message = (
                f"{self.job}() must take its context (@job(takes_context=True)) to be fanned "
                "out per scope: a run reads its scope key as context.scope."
            )
            errors.append(("scopes", message))
        if not any(field in ("args", "kwargs") for field, _ in errors):
            try:
                registered.check_arguments(self.args, self.kwargs)
            except TypeError as exc:
                errors.append(("args", f"The arguments do not fit {self.job}(): {exc}."))
        return errors


# The statuses of runs a worker may claim (when due): pending and retrying.
CLAIMABLE_STATUSES = [choices.RunStatus.PENDING, choices.RunStatus.RETRYING]
# Backfilled runs wait as retries do, until their release (see backfill.py); a newer fire
# neither supersedes them nor counts them as a retry of its own.
BACKFILLED = Q(trigger=choices.RunTrigger.BACKFILL)
# A backfilled run not started yet: it waits in retrying, attempt 0, until next_retry_at.
AWAITING_RELEASE = BACKFILLED & Q(status=choices.RunStatus.RETRYING, attempt=0)


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

    def occupancy(self, schedule_ids: list[int]) -> dict[tuple[int, str], policies.Occupancy]:
        """What each (schedule, scope) of these schedules has in flight, for the overlap
        policy (one query). An unscoped schedule's runs have the scope ""."""
        active = Q(status__in=[Run.Status.PENDING, Run.Status.RUNNING])
        rows = (
            self.filter(self._of_schedules(schedule_ids), status__in=Run.ACTIVE_STATUSES)
            .values("schedule_id", "scope")
            .annotate(
                active=Count("pk", filter=active),
                queued=Count("pk", filter=Q(status=Run.Status.QUEUED)),
                retrying=Count("pk", filter=Q(status=Run.Status.RETRYING) & ~BACKFILLED),
            )
            .order_by()
        )
        occupancy = policies.Occupancy
        return {
            (row["schedule_id"], row["scope"]): occupancy(
                row["active"], row["queued"], row["retrying"] > 0
            )
            for row in rows
        }

    def _of_schedules(self, schedule_ids: list[int]) -> Q | RawSQL:
        if connections[self.db].vendor != "postgresql":
            return Q(schedule_id__in=schedule_ids)
        # A planner's batch has thousands of ids: one array parameter, not one each.
        column = f"{connections[self.db].ops.quote_name(Run._meta.db_table)}.schedule_id"
        return RawSQL(
            f"{column} = ANY(%s::bigint[])",
            [arrays.integers(schedule_ids)],
            output_field=models.BooleanField(),
        )

    def supersede_retries(self, now: datetime) -> int:
        """End these runs' waiting retries ``failed``: a newer fire of their schedule replaced
        them."""
        retries = self.filter(status=Run.Status.RETRYING).exclude(BACKFILLED)
        return retries.update(
            status=Run.Status.FAILED,
            error_code=ErrorCode.SUPERSEDED,
            error_message="A newer fire of its schedule replaced it before it was retried.",
            next_retry_at=None,
            finished_at=now,
        )

    def promote_queued(self, schedule_ids: Iterable[int] | None) -> int:
        """Make the oldest queued run of each (schedule, scope) of these schedules pending
        once that scope has no active run.

        ``None`` means every schedule: the sweeper's pass for runs a crash left queued.
        """
        if schedule_ids is not None:
            schedule_ids = list(schedule_ids)
            if not schedule_ids:
                return 0  # most outcomes: no queue to move, and no query to build
        queued = self.filter(status=Run.Status.QUEUED)
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
        holding = self.filter(**same_scope, exclusive=True, status__in=Run.SLOT_STATUSES)
        # Queued still when updated: another process may have moved it meanwhile.
        candidates = self.filter(pk__in=oldest, status=Run.Status.QUEUED).filter(~Exists(holding))
        try:
            with transaction.atomic(using=self.db):
                promoted = candidates.update(status=Run.Status.PENDING)
        except IntegrityError:
            return 0  # another process promoted a run of the same scope first: it starts
        if promoted:
            wakeups.notify(self.db)
        return promoted

    def claimable(self, now: datetime) -> "RunQuerySet":
        """Runs a worker may start now: pending ones due, and retries whose delay has passed."""
        due = Q(status=Run.Status.PENDING, plan_time__lte=now)
        retry_due = Q(status=Run.Status.RETRYING, next_retry_at__lte=now)
        return self.filter(due | retry_due).order_by("plan_time", "pk")

    def executed_here(self) -> "RunQuerySet":
        """Runs that ``run_scheduler``'s own workers execute (none handed to a tasks backend)."""
        return self.filter(tasks_backend="")

    def handed_off(self) -> "RunQuerySet":
        """Runs that a tasks backend's workers execute (``Schedule.tasks_backend``)."""
        return self.exclude(tasks_backend="")

    def coming(self, now: datetime, ahead: timedelta) -> "RunQuerySet":
        """Pending runs planned ahead, due within ``ahead`` of ``now`` but not yet."""
        pending = self.filter(status=Run.Status.PENDING)
        soon = pending.filter(plan_time__gt=now, plan_time__lte=now + ahead)
        return soon.order_by("plan_time", "pk")


class Run(models.Model):
    """One firing of a schedule and its outcome; one row per (schedule, plan time)."""

    Status = choices.RunStatus
    Trigger = choices.RunTrigger

    WAITING_STATUSES = choices.WAITING_STATUSES
    ACTIVE_STATUSES = choices.ACTIVE_STATUSES
    FINAL_STATUSES = choices.FINAL_STATUSES
    SLOT_STATUSES = choices.SLOT_STATUSES

    # Indexed by periodic_run_history (schedule, -plan_time); a second index costs every insert.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    plan_time = models.DateTimeField(help_text=_("The nominal fire time (UTC)."))
    scope = models.CharField(
        max_length=scope_providers.KEY_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("The scope key of a fanned-out fire; empty for an unscoped run."),
    )
    trigger = models.CharField(max_length=16, choices=Trigger, default=Trigger.SCHEDULE)
    schedule_revision = models.PositiveIntegerField(
        _("revision"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("The schedule's revision that planned it; empty if recorded before revisions."),
    )
    status = models.CharField(max_length=16, choices=Status, default=Status.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    interruptions = models.PositiveIntegerField(
        default=0, help_text=_("Attempts cut short because their process died or stopped.")
    )
    exclusive = models.BooleanField(
        default=True,
        editable=False,
        help_text=_("Counts as its schedule's one active run (overlap is not “concurrent”)."),
    )
    start_deadline = models.DateTimeField(
        null=True, blank=True, help_text=_("Skipped if not started by then.")
    )
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.DurationField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(
        max_length=200, blank=True, help_text=_("Why it failed or was skipped, machine-readable.")
    )
    error_message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    job_name = models.CharField(max_length=200)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    tasks_backend = models.CharField(
        max_length=100,
        blank=True,
        editable=False,
        help_text=_("The TASKS backend that executes it; empty: run_scheduler's own workers."),
    )
    task_id = models.CharField(
        max_length=255, blank=True, editable=False, help_text=_("Its task in that backend.")
    )
    enqueued_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text=_("When its task was last enqueued.")
    )
    created_at = models.DateTimeField(default=clock.wall_now, editable=False)

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
                fields=["plan_time", "id"],
                condition=Q(status__in=CLAIMABLE_STATUSES, tasks_backend=""),
                name="periodic_run_claimable",
            ),
            # What each scope has in flight (occupancy) and its oldest queued run (promotion),
            # without reading the runs of a fanned-out schedule's other scopes.
            models.Index(
                fields=["plan_time"],
                condition=Q(status__in=CLAIMABLE_STATUSES, enqueued_at__isnull=True)
                & ~Q(tasks_backend=""),
                name="periodic_run_to_enqueue",
            ),
            models.Index(
                fields=["schedule", "scope"],
                condition=Q(status__in=choices.ACTIVE_STATUSES),
                name="periodic_run_active",
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
        return (
            self.trigger == Run.Trigger.BACKFILL
            and self.status == Run.Status.RETRYING
            and self.attempt == 0
        )

    @classmethod
    def for_schedule(cls, schedule: Schedule, plan_time: datetime, **fields: Any) -> "Run":
        """An unsaved run of ``schedule`` with a snapshot of what it will call."""
        snapshot = {
            "job_name": schedule.job,
            "args": schedule.args,
            "kwargs": schedule.kwargs,
            "schedule_revision": schedule.revision,
        }
        return cls(
            schedule=schedule,
            plan_time=plan_time,
            max_attempts=schedule.max_attempts,
            tasks_backend=tasks_backend_for(schedule.tasks_backend),
            exclusive=policies.is_exclusive(schedule.overlap),
            **{**snapshot, **fields},
        )


class SchedulerProcessQuerySet(models.QuerySet["SchedulerProcess"]):
    def stale(self, now: datetime) -> "SchedulerProcessQuerySet":
        """Processes presumed dead: no heartbeat for ``SchedulerProcess.stale_after()``."""
        return self.filter(heartbeat_at__lt=now - SchedulerProcess.stale_after())

    def alive(self, now: datetime) -> "SchedulerProcessQuerySet":
        """Processes presumed alive: the others than ``stale(now)``."""
        return self.filter(heartbeat_at__gte=now - SchedulerProcess.stale_after())

    def forgettable(self) -> "SchedulerProcessQuerySet":
        """Those holding no lease any more: their rows can go (the sweeper's pass).

        A process away longer than ``stale_after()`` that still holds a lease keeps its row,
        so that it can take up its heartbeat again if it comes back before the lease expires.
        """
        held = Lease.objects.filter(process=OuterRef("pk"), released_at__isnull=True)
        return self.filter(~Exists(held))


class SchedulerProcess(models.Model):
    """A live ``run_scheduler`` process; its heartbeat tells operators it is alive."""

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    locked_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_(
            "When it last took its session lock (PostgreSQL), which tells others at once "
            "that it died; empty: it holds none, and only its leases' expiry tells."
        ),
    )

    objects = SchedulerProcessQuerySet.as_manager()

    class Meta:
        ordering = ["started_at"]
        verbose_name_plural = _("scheduler processes")

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    # Three heartbeats missed: presumed dead (its leases have expired with the defaults).
    STALE_AFTER_HEARTBEATS = 3

    @classmethod
    def stale_after(cls) -> timedelta:
        """How long without a heartbeat before operators should presume a process dead."""
        # A process holding no lease heartbeats once an IDLE_INTERVAL only.
        settings = get_settings()
        interval = max(settings.HEARTBEAT_INTERVAL, settings.IDLE_INTERVAL)
        return interval * cls.STALE_AFTER_HEARTBEATS

    @classmethod
    def stale_silence(cls, silence: timedelta) -> bool:
        """Whether a process silent (no heartbeat) this long is presumed dead."""
        return silence > cls.stale_after()

    def alive_at(self, now: datetime) -> bool:
        """Whether this process is presumed alive at ``now`` (as ``alive(now)`` selects)."""
        return not self.stale_silence(now - self.heartbeat_at)


class LeaseQuerySet(models.QuerySet["Lease"]):
    def held(self) -> "LeaseQuerySet":
        return self.filter(released_at__isnull=True)

    def expired(self, now: datetime) -> "LeaseQuerySet":
        return self.filter(released_at__isnull=True, expires_at__lt=now)


class Lease(models.Model):
    """One execution attempt of a run. Only the holder of ``token`` may change the run."""

    Outcome = choices.LeaseOutcome

    # Indexed by the (run, attempt) unique constraint.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases", db_index=False)
    attempt = models.PositiveIntegerField()
    token = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    holder = models.CharField(max_length=300, help_text=_("host:pid of the process."))
    process = models.ForeignKey(
        SchedulerProcess, null=True, blank=True, on_delete=models.SET_NULL, related_name="leases"
    )
    acquired_at = models.DateTimeField()
    started_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("When its job was called; empty: claimed, but the job never started."),
    )
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True, choices=choices.LeaseOutcome)

    objects = LeaseQuerySet.as_manager()

    class Meta:
        # Its own columns: ordering by "run" would join runs to sort by their ordering.
        ordering = ["run_id", "attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "attempt"], name="periodic_lease_one_per_attempt"
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"],
                condition=Q(released_at__isnull=True),
                name="periodic_lease_held",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.attempt} of run {self.run_id} by {self.holder}"
