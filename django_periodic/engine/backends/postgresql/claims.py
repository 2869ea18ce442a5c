"""Claiming on PostgreSQL: the one statement that claims a batch, and reading its rows.

``claims.py`` owns claiming and calls ``claim`` on PostgreSQL. The statement
locks the oldest claimable runs (skipping rows other processes hold), skips those past
their start deadline, fails those whose lease cannot be taken, marks the rest running and
inserts their leases, all at the database's clock. Its rows carry the claimed runs' and
their schedules' columns: a claim's values are read from them, and its model instances built
from them (as a queryset would) only when asked for; no claimed run needs a query of its
own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import cache, partial
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.db.models.expressions import RawSQL

from django_periodic.choices import CLAIMABLE_STATUSES, LEDGER_FORMAT, ErrorCode
from django_periodic.db import clock, prepared, timestamps
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.records import (
    LATE_MESSAGE,
    UNLEASABLE_MESSAGE,
    Claim,
    ClaimedValues,
    ClaimRequest,
    ClaimResult,
)
from django_periodic.models import Lease, Run, Schedule
from django_periodic.timing import bounds

# The first claimable runs by release, locked; those past their start deadline are
# skipped, those whose lease cannot be taken (records.can_lease) fail, the rest run under a
# new lease each (started at their release, if claimed ahead of it). The outer SELECT has
# one row even when nothing was claimed, so that the schedules of the runs skipped or
# failed come back.
CLAIM_SQL = """
WITH t AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
picked AS (
    SELECT r.id, r.schedule_id,
           COALESCE({late}, false) AS late
    FROM {run} r CROSS JOIN t
    WHERE {claimable}
    ORDER BY {release}, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r {skip_locked}
),
judged AS (
    SELECT p.id, p.late,
           NOT p.late AND {unleasable} AS unleasable
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
        started_at = GREATEST(t.now, {release}), enqueued_at = NULL
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
# Which runs a claim takes (RunQuerySet.claimable and .coming, restated for the index;
# tests/test_rules.py checks they agree): those that may start now, or (ahead) those due
# soon; those its own workers execute (not handed to a tasks backend), or the one run a
# task names; of the jobs its code registers, in a ledger format it reads
# (RunQuerySet.of_jobs).
# Written so that the index on claimable runs' release times (run.RELEASE, restated as
# RELEASE below) serves every claim, in order, whatever the statistics say (a burst of new
# runs makes them stale for up to a minute):
# - "(SELECT now FROM t)", not a join on t: a value the index scan starts from. Joined,
#   the claim ahead read every overdue run to find those after now (16 ms at 20,000).
# - "release <= now" for retries too (a retry is always after its release), outside
#   the OR: with the OR alone, stale statistics chose another index and sorted every
#   waiting run on each claim (12 ms at 20,000).
RELEASE = "COALESCE(r.release_at, r.plan_time)"


@cache
def _too_late(using: str) -> tuple[str, dict[str, Any]]:
    """Runs too late to start at the claim's clock (``t.now``): the ORM's rule
    (``RunQuerySet.too_late_to_start``) as SQL, with its parameters."""
    at_the_claim: Any = RawSQL("t.now", [])
    late = Run.objects.using(using).too_late_to_start(at_the_claim)
    return rules.condition(late, "late", alias="r")


_CLAIMABLE_STATUSES = ", ".join(f"'{status}'" for status in CLAIMABLE_STATUSES)
CLAIMABLE_NOW = (
    f"r.status IN ({_CLAIMABLE_STATUSES}) AND {RELEASE} <= (SELECT now FROM t)"
    " AND (r.status = 'pending' OR r.next_retry_at <= (SELECT now FROM t))"
)
CLAIMABLE_AHEAD = (
    f"r.status = 'pending' AND {RELEASE} > (SELECT now FROM t)"
    f" AND {RELEASE} <= (SELECT now FROM t) + %(ahead)s"
)
# A lease that cannot be taken: not records.can_lease (tests/test_rules.py checks).
UNLEASABLE = "NOT s.lease_timeout < %(latest)s::timestamptz - t.now"
EXECUTED_HERE = "r.tasks_backend = ''"
BY_ID = "r.id = %(run_id)s"
OF_JOBS = f"r.job_name = ANY(%(jobs)s) AND r.ledger_format <= {LEDGER_FORMAT}"


@cache
def _claim_sql(using: str, ahead: bool, by_id: bool) -> str:
    quote = connections[using].ops.quote_name
    claimable = CLAIMABLE_AHEAD if ahead else CLAIMABLE_NOW
    return CLAIM_SQL.format(
        claimable=f"{claimable} AND {BY_ID if by_id else EXECUTED_HERE} AND {OF_JOBS}",
        release=RELEASE,
        late=_too_late(using)[0],
        unleasable=UNLEASABLE,
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


def _claim(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    """A claim in one statement (``claims._claim_at_once`` on PostgreSQL); the result also
    names the schedules of the runs it skipped as too late, or failed as unleasable."""
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
        "jobs": list(wanted.jobs),
        "started": wanted.starts_at_once,
        **_too_late(using)[1],
    }
    by_id = wanted.run_id is not None
    # A claim's runs mostly share their plan time, and their schedules a few cursors.
    with timestamps.timestamps_parsed_once(using), prepared.cursor(using) as cursor:
        cursor.execute(_claim_sql(using, ahead is not None, by_id), params)
        rows = cursor.fetchall()
    answered_at = time.monotonic()  # not when each instance below is built
    db_claimed_at = rows[0][4]  # the claim's clock, on every row
    claimed_at = answered_at
    if now is None and db_claimed_at is not None:  # it read statement_timestamp()
        claimed_at = clock.monotonic_of(db_claimed_at, answered_at, using)
    late, late_runs, refused, refused_runs = rows[0][:4]
    result = ClaimResult(
        late=late or [],
        refused=refused or [],
        late_runs=late_runs or [],
        refused_runs=refused_runs or [],
    )
    connection = connections[using]  # looked up once: a thread-local look-up is not free
    read_values = _values_reader(using)
    schedules: dict[int, Schedule] = {}  # one instance per schedule, if any is built
    for _late, _late_runs, _refused, _refused_runs, _at, token, *columns in rows:
        if token is None:
            continue  # the one row of a claim that claimed nothing
        build = partial(_build_run, columns, connection, schedules)
        values = read_values(columns, connection)
        result.claims.append(Claim(values, token, using, claimed_at, db_claimed_at, build))
    return result


def _build_run(
    columns: Sequence[Any], connection: BaseDatabaseWrapper, schedules: dict[int, Schedule]
) -> Run:
    """A claimed run's model instance from its row, with its schedule's (shared by the runs
    of one schedule in a claim)."""
    run_count = len(_fields(Run))
    run: Run = _instance(Run, columns[:run_count], connection)
    schedule = schedules.get(run.schedule_id)
    if schedule is None:
        schedule = schedules[run.schedule_id] = _instance(Schedule, columns[run_count:], connection)
    run.schedule = schedule
    return run


# The columns a claim's values are read from: (model, field name). Their order is
# ClaimedValues's, but for release_time (RELEASE: release_at, else plan_time).
_VALUE_FIELDS = (
    (Run, "id"),
    (Run, "schedule"),
    (Run, "job_name"),
    (Run, "args"),
    (Run, "kwargs"),
    (Run, "attempt"),
    (Run, "plan_time"),
    (Run, "release_at"),
    (Run, "start_deadline"),
    (Run, "started_at"),
    (Schedule, "timeout"),
    (Schedule, "overlap"),
    (Schedule, "pause_after_failures"),
    (Run, "concurrency_limit"),
)


@cache
def _values_reader(using: str) -> Callable[[Sequence[Any], BaseDatabaseWrapper], ClaimedValues]:
    """What reads a claim's values from its row: only their columns, converted as a
    queryset would (``_converters``: the JSON of args and kwargs)."""
    run_count = len(_fields(Run))
    offsets = {Run: 0, Schedule: run_count}
    converted: dict[int, tuple[Any, list[Any]]] = {}
    for model, offset in offsets.items():
        for index, expression, converters in _converters(model, using)[1]:
            converted[offset + index] = (expression, converters)
    columns = []
    for model, name in _VALUE_FIELDS:
        index = offsets[model] + [f.name for f in _fields(model)].index(name)
        expression, converters = converted.get(index, (None, []))
        columns.append((index, expression, converters))

    def read(row: Sequence[Any], connection: BaseDatabaseWrapper) -> ClaimedValues:
        values = []
        for index, expression, converters in columns:
            value = row[index]
            for converter in converters:
                value = converter(value, expression, connection)
            values.append(value)
        pk, schedule_id, job, args, kwargs, attempt, plan_time, release_at, *rest = values
        release = release_at or plan_time
        return ClaimedValues(pk, schedule_id, job, args, kwargs, attempt, plan_time, release, *rest)

    return read


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


def _undoable(using: str) -> contextlib.AbstractContextManager[Any]:
    """A savepoint if a transaction is open, which a failed statement would spoil;
    nothing in autocommit (no BEGIN and COMMIT spent on every claim)."""
    if connections[using].in_atomic_block:
        return transaction.atomic(using=using)
    return contextlib.nullcontext()


def claim(
    wanted: ClaimRequest,
    now: datetime | None,
    limit: int,
    using: str,
    ahead: timedelta | None,
) -> ClaimResult:
    """A claim in one statement, in a savepoint when a transaction is open."""
    with _undoable(using):
        return _claim(wanted, now, limit, using, ahead)
