"""Claiming runs: a batch of runs that may start becomes ``running`` under fresh leases.

On PostgreSQL a claim is one statement, whatever its size: it locks the oldest claimable
runs (skipping rows other processes hold), skips those past their start deadline, marks
the rest running and inserts their leases, all at the database's clock. Elsewhere the same
happens through the ORM in one transaction.

A run that cannot be claimed fails alone (``cannot_claim``): one whose lease would expire
past the range of stored times (its schedule's ``lease_timeout`` is out of range) is failed
by the claim itself, and if a claim fails as a whole, its runs are claimed again one at a
time to find the one at fault.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Field, Model, Value
from django.db.models.functions import Greatest, Now
from django.dispatch import Signal

from django_periodic import bounds, clock, loading, policies, signals
from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.models import Lease, Run, RunQuerySet, Schedule, SchedulerProcess

logger = logging.getLogger("django_periodic")

LATE_MESSAGE = "No worker could start it within its misfire grace."
UNLEASABLE_MESSAGE = (
    f"Cannot claim: its schedule's lease_timeout would make its lease expire after "
    f"{bounds.LATEST:%Y-%m-%d}, past every time a row may hold."
)


@dataclass(frozen=True)
class Claim:
    """A run this process holds, and the token that proves it (which alone tells claims
    apart: hashing a model instance costs more, and claims are kept in sets and dicts)."""

    run: Run = field(compare=False)
    token: UUID
    using: str = field(default="default", compare=False)
    # When this process made the claim (time.monotonic()), to date the job's real start.
    claimed_at: float = field(default_factory=time.monotonic, compare=False)
    # The database's clock at the claim; None: the run's started_at (claimed when due).
    db_claimed_at: datetime | None = field(default=None, compare=False)

    @property
    def _db_claimed(self) -> datetime | None:
        return self.db_claimed_at or self.run.started_at

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
        deadline = self.run.start_deadline
        if self.run.attempt != 1 or deadline is None or at is None:
            return False
        return at > deadline

    def starts_at(self) -> float:
        """When the run may start (time.monotonic()): at once, or at its plan time if it was
        claimed ahead of it."""
        claimed = self._db_claimed
        if claimed is None or self.run.plan_time <= claimed:
            return self.claimed_at
        return self.claimed_at + (self.run.plan_time - claimed).total_seconds()


@dataclass
class ClaimResult:
    claims: list[Claim] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # schedules of the runs skipped as late
    refused: list[int] = field(default_factory=list)  # ...and of those failed cannot_claim

    def __add__(self, other: ClaimResult) -> ClaimResult:
        return ClaimResult(
            self.claims + other.claims, self.late + other.late, self.refused + other.refused
        )


def can_lease(lease_timeout: timedelta, now: datetime) -> bool:
    """Whether a lease taken at ``now`` expires within the range of stored times (CLAIM_SQL
    says the same in SQL)."""
    return lease_timeout < bounds.LATEST - now


def claim(
    process: SchedulerProcess,
    now: datetime | None,
    limit: int,
    using: str = "default",
    *,
    ahead: timedelta | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` runs that may start now, skipping rows other processes hold.

    ``now`` None means the database's clock at the statement (no clock read first). With
    ``ahead``, claim instead pending runs due within ``ahead`` of now and not yet: the
    caller holds them until their plan time, so that they start on time. Only runs that
    ``run_scheduler``'s own workers execute are claimed (none handed to a tasks backend).
    """
    return claim_batch(process, now, limit, using, ahead=ahead).claims


def claim_run(
    run_id: int, holder: str, using: str = "default", *, now: datetime | None = None
) -> Claim | None:
    """Claim one run by id if it may start now, for a worker outside ``run_scheduler`` (a
    tasks backend's, ``holder`` naming it); None if it may not (already claimed, finished,
    cancelled, not due) or was past its start deadline (then skipped).

    ``now`` None means the database's clock; ``django_periodic.testing.run_due`` passes the
    time it runs at."""
    wanted = _Wanted(holder=holder, run_id=run_id, starts_at_once=True)
    claimed = _claim_repeating(wanted, now, 1, using, None).claims
    return claimed[0] if claimed else None


@dataclass(frozen=True)
class _Wanted:
    """Who claims (the lease's holder and process), and which runs: those its workers
    execute, or one run by id (a tasks backend's worker)."""

    holder: str
    process_id: int | None = None
    run_id: int | None = None
    # The claiming thread calls the job right after the claim (a tasks backend's worker):
    # the claim marks the lease started too (starts.py marks the others).
    starts_at_once: bool = False


def claim_batch(
    process: SchedulerProcess,
    now: datetime | None,
    limit: int,
    using: str = "default",
    *,
    ahead: timedelta | None = None,
) -> ClaimResult:
    """``claim()``, also reporting the schedules of the runs it skipped as too late, or
    failed as impossible to claim."""
    wanted = _Wanted(holder=str(process), process_id=process.pk)
    return _claim_repeating(wanted, now, limit, using, ahead)


def _claim_repeating(
    wanted: _Wanted,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    if limit <= 0:
        return ClaimResult()
    try:
        result = _claim_at_once(wanted, now, limit, using, ahead)
    except policies.CONNECTION_ERRORS:
        raise  # the database's failure, not a run's: the loop retries
    except Exception:
        # One run the claim cannot take must not stop the others: find it.
        logger.exception("A claim failed; claiming its runs one at a time.")
        result = _claim_one_by_one(wanted, now, limit, using, ahead)
    if result.claims and signals.listened(signals.run_started):
        signals.send_on_commit(map(_started, result.claims), using)
    ended = result.late + result.refused
    promoted = ended and Run.objects.using(using).promote_queued(ended)
    if promoted and len(result.claims) < limit and wanted.run_id is None:
        # A run skipped or failed made way for a queued one: it may start now too.
        more = _claim_repeating(wanted, now, limit - len(result.claims), using, ahead)
        result.claims += more.claims
    return result


def _claim_at_once(
    wanted: _Wanted,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    if connections[using].vendor == "postgresql":
        with _undoable(using):
            return _claim_postgresql(wanted, now, limit, using, ahead)
    return _claim_orm(wanted, now, limit, using, ahead)


def _undoable(using: str) -> contextlib.AbstractContextManager[Any]:
    """A savepoint if a transaction is open, which a failed statement would spoil;
    nothing in autocommit (no BEGIN and COMMIT spent on every claim)."""
    if connections[using].in_atomic_block:
        return transaction.atomic(using=using)
    return contextlib.nullcontext()


def _claim_one_by_one(
    wanted: _Wanted,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    """Claim the runs a failed claim would have taken, each alone; one that fails even
    alone ends ``failed`` (``cannot_claim``), with the error, and the others are claimed."""
    result = ClaimResult()
    claimable = _claimable(wanted, now or clock.now(using), ahead, using)
    for run_id in claimable.values_list("pk", flat=True)[:limit]:
        try:
            with transaction.atomic(using=using):
                result += _claim_at_once(replace(wanted, run_id=run_id), now, 1, using, ahead)
        except policies.CONNECTION_ERRORS:
            raise
        except Exception as exc:
            logger.exception("Run %s cannot be claimed.", run_id)
            message = f"Cannot claim: {type(exc).__name__}: {exc}"
            result.refused += fail_unclaimed([run_id], ErrorCode.CANNOT_CLAIM, message, using)
    return result


def _claimable(wanted: _Wanted, now: datetime, ahead: timedelta | None, using: str) -> RunQuerySet:
    """The runs a claim takes, oldest first: those that may start now, or (ahead) those
    due soon; those its workers execute, or the one run it names."""
    runs = Run.objects.using(using)
    claimable = runs.coming(now, ahead) if ahead else runs.claimable(now)
    if wanted.run_id is None:
        return claimable.executed_here()
    return claimable.filter(pk=wanted.run_id)


def fail_unclaimed(run_ids: list[int], code: str, message: str, using: str) -> list[int]:
    """Fail runs waiting to start (pending or retrying) that no worker can ever claim, with
    ``code`` and ``message``; return their schedules, whose queued runs may move up.

    One run's failure, never the process's: rare, so a few statements each time.
    """
    waiting = Run.objects.using(using).filter(
        pk__in=run_ids, status__in=[Run.Status.PENDING, Run.Status.RETRYING]
    )
    with transaction.atomic(using=using):
        rows = list(waiting.select_for_update().values_list("pk", "schedule_id"))
        Run.objects.using(using).filter(pk__in=[pk for pk, _ in rows]).update(
            status=Run.Status.FAILED,
            error_code=code,
            error_message=message[: get_settings().ERROR_MAX_CHARS],
            next_retry_at=None,
            enqueued_at=None,
            finished_at=Now(),
        )
        _announce_ended([pk for pk, _ in rows], signals.run_finished, using, duration=None)
    for pk, _ in rows:
        logger.error("Run %s failed (%s): %s", pk, code, message)
    return [schedule_id for _, schedule_id in rows]


def _started(claim: Claim) -> signals.Event:
    return signals.of_run(signals.run_started, claim.run, started_at=claim.run.started_at)


def _announce_ended(run_ids: list[int], signal: Signal, using: str, **extra: Any) -> None:
    """``signal`` for runs a claim ended without running them: ``run_skipped`` for those
    past their start deadline, ``run_finished`` for those it failed (rare: one query)."""
    if run_ids and signals.listened(signal):
        ended = Run.objects.using(using).filter(pk__in=run_ids).select_related("schedule")
        signals.send_on_commit((signals.of_run(signal, r, **extra) for r in ended), using)


def _claim_orm(
    wanted: _Wanted,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    now = now or clock.now(using)
    result = ClaimResult(late=[] if ahead else skip_late(now, using))
    runs_ = Run.objects.using(using)
    with transaction.atomic(using=using):
        claimable = _claimable(wanted, now, ahead, using).select_related("schedule")
        by_id = wanted.run_id is not None  # see _claim_sql
        locked = claimable.select_for_update(skip_locked=not by_id, of=("self",))
        runs = list(locked[:limit])
        unleasable = [run.pk for run in runs if not can_lease(run.schedule.lease_timeout, now)]
        if unleasable:
            result.refused = fail_unclaimed(
                unleasable, ErrorCode.CANNOT_CLAIM, UNLEASABLE_MESSAGE, using
            )
            runs = [run for run in runs if run.pk not in unleasable]
        if not runs:
            return result
        runs_.filter(pk__in=[r.pk for r in runs]).update(
            status=Run.Status.RUNNING,
            attempt=F("attempt") + 1,
            started_at=Greatest(Value(now), F("plan_time")),
            enqueued_at=None,
        )
        leases = [_new_lease(run, wanted, now) for run in runs]
        Lease.objects.using(using).bulk_create(leases)
    result.claims = [
        Claim(run, lease.token, using, db_claimed_at=now)
        for run, lease in zip(runs, leases, strict=True)
    ]
    return result


def skip_late(now: datetime, using: str = "default") -> list[int]:
    """Skip pending fires no worker started before their start deadline (all were busy);
    return their schedules. A claim on PostgreSQL does this for the runs it picks."""
    late = Run.objects.using(using).filter(
        status=Run.Status.PENDING, attempt=0, start_deadline__lt=now
    )
    with transaction.atomic(using=using):
        rows = list(late.select_for_update(skip_locked=True).values_list("pk", "schedule_id"))
        if rows:
            Run.objects.using(using).filter(pk__in=[pk for pk, _ in rows]).update(
                status=Run.Status.SKIPPED,
                error_code=ErrorCode.START_DEADLINE,
                error_message=LATE_MESSAGE,
                finished_at=now,
            )
            _announce_ended([pk for pk, _ in rows], signals.run_skipped, using)
    return [schedule_id for _, schedule_id in rows]


def _new_lease(run: Run, wanted: _Wanted, now: datetime) -> Lease:
    """The lease for the run's next attempt; also mirrors the claim's UPDATE on ``run``."""
    run.attempt += 1
    run.status, run.started_at = Run.Status.RUNNING, max(now, run.plan_time)
    run.enqueued_at = None
    return Lease(
        run=run,
        attempt=run.attempt,
        holder=wanted.holder,
        process_id=wanted.process_id,
        acquired_at=now,
        started_at=now if wanted.starts_at_once else None,
        heartbeat_at=now,
        expires_at=now + run.schedule.lease_timeout,
    )


# The oldest claimable runs, locked; those past their start deadline are skipped, those
# whose lease cannot be taken (can_lease) fail, the rest run under a new lease each
# (started at their plan time, if claimed ahead of it). The outer SELECT has one row even
# when nothing was claimed, so that the schedules of the runs skipped or failed come back.
CLAIM_SQL = """
WITH t AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
picked AS (
    SELECT r.id, r.schedule_id,
           COALESCE(r.status = 'pending' AND r.attempt = 0 AND r.start_deadline < t.now, false)
           AS late
    FROM {run} r CROSS JOIN t
    WHERE {claimable}
    ORDER BY r.plan_time, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r {skip_locked}
),
judged AS (
    SELECT p.id, p.late,
           NOT p.late AND NOT s.lease_timeout < %(latest)s::timestamptz - t.now AS unleasable
    FROM picked p JOIN {schedule} s ON s.id = p.schedule_id CROSS JOIN t
),
skipped AS (
    UPDATE {run} r SET status = 'skipped', error_code = %(late_code)s,
        error_message = %(late_message)s, finished_at = t.now
    FROM judged p CROSS JOIN t WHERE r.id = p.id AND p.late
    RETURNING r.schedule_id, r.id
),
refused AS (
    UPDATE {run} r SET status = 'failed', error_code = %(refused_code)s,
        error_message = %(refused_message)s, next_retry_at = NULL, finished_at = t.now
    FROM judged p CROSS JOIN t WHERE r.id = p.id AND p.unleasable
    RETURNING r.schedule_id, r.id
),
claimed AS (
    UPDATE {run} r SET status = 'running', attempt = r.attempt + 1,
        started_at = GREATEST(t.now, r.plan_time), enqueued_at = NULL
    FROM judged p CROSS JOIN t WHERE r.id = p.id AND NOT p.late AND NOT p.unleasable
    RETURNING r.*
),
leased AS (
    INSERT INTO {lease} (run_id, attempt, token, holder, process_id, acquired_at,
                         started_at, heartbeat_at, expires_at, outcome)
    SELECT c.id, c.attempt, gen_random_uuid(), %(holder)s, %(process)s, t.now,
           CASE WHEN %(started)s THEN t.now END, t.now, t.now + s.lease_timeout, ''
    FROM claimed c JOIN {schedule} s ON s.id = c.schedule_id CROSS JOIN t
    RETURNING run_id, token
)
SELECT k.late, k.late_runs, f.refused, f.refused_runs, t.now, l.token, {run_columns},
       {schedule_columns}
FROM (SELECT array_agg(schedule_id) AS late, array_agg(id) AS late_runs FROM skipped) k
CROSS JOIN (SELECT array_agg(schedule_id) AS refused, array_agg(id) AS refused_runs
            FROM refused) f
CROSS JOIN t
LEFT JOIN (claimed c JOIN leased l ON l.run_id = c.id JOIN {schedule} s ON s.id = c.schedule_id)
    ON true
"""
# Which runs a claim takes: those that may start now, or (ahead) those due soon; those its
# own workers execute (not handed to a tasks backend), or the one run a task names.
# Written so that the index on claimable runs' plan times serves every claim, in order,
# whatever the statistics say (a burst of new runs makes them stale for up to a minute):
# - "(SELECT now FROM t)", not a join on t: a value the index scan starts from. Joined,
#   the claim ahead read every overdue run to find those after now (16 ms at 20,000).
# - "plan_time <= now" for retries too (a retry is always after its plan time), outside
#   the OR: with the OR alone, stale statistics chose another index and sorted every
#   waiting run on each claim (12 ms at 20,000).
CLAIMABLE_NOW = (
    "r.status IN ('pending', 'retrying') AND r.plan_time <= (SELECT now FROM t)"
    " AND (r.status = 'pending' OR r.next_retry_at <= (SELECT now FROM t))"
)
CLAIMABLE_AHEAD = (
    "r.status = 'pending' AND r.plan_time > (SELECT now FROM t)"
    " AND r.plan_time <= (SELECT now FROM t) + %(ahead)s"
)
EXECUTED_HERE = "r.tasks_backend = ''"
BY_ID = "r.id = %(run_id)s"


@cache
def _claim_sql(using: str, ahead: bool, by_id: bool) -> str:
    quote = connections[using].ops.quote_name
    claimable = CLAIMABLE_AHEAD if ahead else CLAIMABLE_NOW
    return CLAIM_SQL.format(
        claimable=f"{claimable} AND {BY_ID if by_id else EXECUTED_HERE}",
        # A task's run is locked only for moments (its dispatcher noting the task's id):
        # wait for it, or the task would find nothing to claim and its run wait for nothing.
        skip_locked="" if by_id else "SKIP LOCKED",
        run=quote(Run._meta.db_table),
        lease=quote(Lease._meta.db_table),
        schedule=quote(Schedule._meta.db_table),
        run_columns=", ".join(f"c.{quote(f.column or f.name)}" for f in _fields(Run)),
        schedule_columns=", ".join(f"s.{quote(f.column or f.name)}" for f in _fields(Schedule)),
    )


def _fields(model: type[Model]) -> Sequence[Field[Any, Any]]:
    return model._meta.concrete_fields


def _claim_postgresql(
    wanted: _Wanted,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    params: dict[str, Any] = {
        "now": now,
        "ahead": ahead,
        "limit": limit,
        "late_code": ErrorCode.START_DEADLINE,
        "late_message": LATE_MESSAGE,
        "latest": bounds.LATEST,
        "refused_code": ErrorCode.CANNOT_CLAIM,
        "refused_message": UNLEASABLE_MESSAGE,
        "holder": wanted.holder,
        "process": wanted.process_id,
        "run_id": wanted.run_id,
        "started": wanted.starts_at_once,
    }
    by_id = wanted.run_id is not None
    # A claim's runs mostly share their plan time, and their schedules a few cursors.
    with loading.timestamps_parsed_once(using), connections[using].cursor() as cursor:
        cursor.execute(_claim_sql(using, ahead is not None, by_id), params)
        rows = cursor.fetchall()
    answered_at = time.monotonic()  # not when each instance below is built
    db_claimed_at = rows[0][4]  # the claim's clock, on every row
    claimed_at = answered_at
    if now is None and db_claimed_at is not None:  # it read statement_timestamp()
        claimed_at = clock.monotonic_of(db_claimed_at, answered_at, using)
    late, late_runs, refused, refused_runs = rows[0][:4]
    result = ClaimResult(late=late or [], refused=refused or [])
    _announce_ended(late_runs or [], signals.run_skipped, using)
    _announce_ended(refused_runs or [], signals.run_finished, using, duration=None)
    run_count = len(_fields(Run))
    schedules: dict[int, Schedule] = {}  # one instance per schedule in a claim
    connection = connections[using]  # looked up once: a thread-local look-up is not free
    for _late, _late_runs, _refused, _refused_runs, _at, token, *columns in rows:
        if token is None:
            continue  # the one row of a claim that claimed nothing
        run = _instance(Run, columns[:run_count], connection)
        schedule = schedules.get(run.schedule_id)
        if schedule is None:
            schedule = schedules[run.schedule_id] = _instance(
                Schedule, columns[run_count:], connection
            )
        run.schedule = schedule
        result.claims.append(Claim(run, token, using, claimed_at, db_claimed_at=db_claimed_at))
    return result


def _instance(model: type[Model], values: Sequence[Any], connection: BaseDatabaseWrapper) -> Any:
    """A model instance from raw column values, converted as a queryset would."""
    using = connection.alias
    attnames, converters = _converters(model, using)
    converted = list(values)
    for index, expression, field_converters in converters:
        for converter in field_converters:
            converted[index] = converter(converted[index], expression, connection)
    return model.from_db(using, attnames, converted)


@cache
def _converters(
    model: type[Model], using: str
) -> tuple[list[str], list[tuple[int, Any, list[Any]]]]:
    """The attribute names of ``model``'s columns, and the converters of those that have
    some (index, column expression, converters): worked out once, not for every row."""
    connection = connections[using]
    fields = _fields(model)
    converters = []
    for index, model_field in enumerate(fields):
        expression = model_field.get_col(model._meta.db_table)
        field_converters = connection.ops.get_db_converters(expression)
        field_converters += model_field.get_db_converters(connection)
        if field_converters:
            converters.append((index, expression, field_converters))
    return [f.attname for f in fields], converters
