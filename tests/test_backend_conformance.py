"""Both ledger backends, every operation, on the same rows (PostgreSQL only).

The SQLite ledger is the ORM's, so it runs on PostgreSQL too: each test builds rows once,
runs an operation through ``PostgreSQLLedger`` and through ``SQLiteLedger`` (a write in a
savepoint rolled back after it, so that both find the same rows), and compares what each
returns and writes. Where they differ by design, the comparison says so: a lease's random
token, the clock a statement writes (its own, or the transaction's), and which late runs a
claim skips (the ORM skips every run too late to start before it claims, PostgreSQL those
its claim picks). Planning is compared on twin schedules (alike but for their names), each
recorded one way.
"""

import itertools
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F, Value

from django_periodic.choices import ErrorCode, Overlap, RunStatus
from django_periodic.engine import fleet, records
from django_periodic.engine.backends.postgresql import PostgreSQLLedger
from django_periodic.engine.backends.sqlite import SQLiteLedger
from django_periodic.engine.planning import backfill, planner, recording
from django_periodic.engine.records import Claim, ClaimRequest, Decision, Due, Fire
from django_periodic.engine.runs import outcomes
from django_periodic.models import Lease, Run, Schedule
from django_periodic.models.run import (
    COPIED_FROM_SCHEDULE,
    finished_when_recorded,
    taken_from_schedule,
)
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import set_cursor
from tests.test_bad_rows import drop_check_constraints

pytestmark = pytest.mark.django_db
SECOND = timedelta(seconds=1)
BACKENDS = (PostgreSQLLedger, SQLiteLedger)


def through_both(operation: Callable[[Any], Any], written: Callable[[], Any]) -> list[Any]:
    """``operation`` through each backend on the same rows: what it returned and what
    ``written`` reads after it, each in a savepoint rolled back."""
    seen = []
    for backend in BACKENDS:
        with transaction.atomic():
            returned = operation(backend("default"))
            seen.append((returned, written()))
            transaction.set_rollback(True)
    return seen


def run_states(runs=None) -> list[dict]:
    """Every run's stored fields, by id."""
    return list((runs or Run.objects.all()).order_by("pk").values())


def lease_states() -> list[dict]:
    """Every lease's fields but its token (random) and id, by run and attempt."""
    fields = [f.attname for f in Lease._meta.concrete_fields if f.attname not in {"id", "token"}]
    return list(Lease.objects.order_by("run_id", "attempt").values(*fields))


def claim_rows(now) -> dict[str, Run]:
    """Runs a claim may take, skip as too late, fail as unleasable, or leave."""
    schedule = ScheduleFactory(job="tests.jobs.noop", overlap=Overlap.CONCURRENT)
    unleasable = ScheduleFactory(job="tests.jobs.noop", overlap=Overlap.CONCURRENT)
    # A lease_timeout its CHECK constraint refuses, as a row stored before it was: its lease
    # would end past every time a row may hold (records.can_lease).
    drop_check_constraints()  # in the test's transaction: rolled back after it
    Schedule.objects.filter(pk=unleasable.pk).update(lease_timeout=timedelta(days=3_000_000))
    made = itertools.count()

    def run(schedule=schedule, **fields) -> Run:
        fields.setdefault("plan_time", now - timedelta(minutes=1))
        fields["plan_time"] += timedelta(microseconds=next(made))
        return RunFactory(schedule=schedule, exclusive=False, **fields)

    return {
        "due": run(status=RunStatus.PENDING),
        "staggered": run(status=RunStatus.PENDING, release_at=now - SECOND),
        "late": run(status=RunStatus.PENDING, start_deadline=now - SECOND),
        "retry": run(status=RunStatus.RETRYING, attempt=1, next_retry_at=now - SECOND),
        "retry_later": run(status=RunStatus.RETRYING, attempt=1, next_retry_at=now + SECOND),
        "coming": run(status=RunStatus.PENDING, plan_time=now + 5 * SECOND),
        "handed_off": run(status=RunStatus.PENDING, tasks_backend="default"),
        "other_job": run(status=RunStatus.PENDING, job_name="tests.jobs.add"),
        "unleasable": run(schedule=unleasable, status=RunStatus.PENDING),
    }


def compared(result: records.ClaimResult) -> tuple[Any, ...]:
    """What a claim's result says, in an order that does not depend on the backend."""
    claimed = sorted((c.run.pk, c.run.status, c.run.attempt) for c in result.claims)
    ended = (result.late, result.refused, result.late_runs, result.refused_runs)
    return (claimed, *(sorted(ids) for ids in ended))


def differences(by_sql: list[dict], by_orm: list[dict]) -> dict[int, dict[str, tuple]]:
    """The fields each row has otherwise through each backend: (by SQL, by the ORM)."""
    return {
        sql.get("id", n): {
            name: (value, orm[name]) for name, value in sql.items() if orm[name] != value
        }
        for n, (sql, orm) in enumerate(zip(by_sql, by_orm, strict=True))
        if sql != orm
    }


@pytest.mark.parametrize("ahead", [None, 10 * SECOND])
def test_a_claim_takes_skips_and_fails_the_same_runs(postgres, now, process, ahead):
    rows = claim_rows(now)
    wanted = ClaimRequest(str(process), ("tests.jobs.noop",), process.pk)

    def claim(backend):
        return compared(backend.claim(wanted, now, 100, ahead))

    (sql, (sql_runs, sql_leases)), (orm, (orm_runs, orm_leases)) = through_both(
        claim, lambda: (run_states(), lease_states())
    )
    assert sql == orm
    assert sql[0]  # the comparison is of something
    differ = differences(sql_runs, orm_runs)
    if not ahead:
        assert sql[1:3] == ([rows["late"].schedule_id], [rows["unleasable"].schedule_id])
        # A run failed as unleasable ends at the claim's clock in its statement, at the
        # transaction's through the ORM (Now()): both set, maybe apart.
        refused = differ.pop(rows["unleasable"].pk, {})
        assert set(refused) <= {"finished_at"} and all(refused.get("finished_at", (1, 1)))
    assert differ == {}
    assert differences(sql_leases, orm_leases) == {}


def test_a_claim_by_id_takes_the_same_run(postgres, now):
    """A task's worker claims one run by id. (The ORM skips every run too late to start
    before it claims, PostgreSQL only those its claim picks: the late runs are left out.)"""
    rows = claim_rows(now)
    wanted = ClaimRequest(
        "worker", ("tests.jobs.noop",), run_id=rows["due"].pk, starts_at_once=True
    )

    def claim(backend):
        return compared(backend.claim(wanted, now, 1, None))[0]

    claimed = rows["due"].pk
    (sql, (sql_run, sql_lease)), (orm, (orm_run, orm_lease)) = through_both(
        claim, lambda: (run_states(Run.objects.filter(pk=claimed)), lease_states())
    )
    assert sql == orm and sql
    assert differences(sql_run, orm_run) == {}
    assert differences(sql_lease, orm_lease) == {}


def test_a_claim_at_the_databases_clock_claims_the_same_runs(postgres, now, process):
    claim_rows(now - timedelta(minutes=1))
    wanted = ClaimRequest(str(process), ("tests.jobs.noop",), process.pk)

    def claim(backend):
        return compared(backend.claim(wanted, None, 100, None))

    (sql, _), (orm, _) = through_both(claim, lambda: None)
    assert sql == orm and sql[0]


def held_leases(now, process) -> list[Lease]:
    """Leases held by ``process``: started, not started, expired; one released, one of
    another process, one expired long ago."""
    other = SchedulerProcessFactory(host="other", pid=2, started_at=now)
    leases = [
        LeaseFactory(process=process, acquired_at=now - SECOND),
        LeaseFactory(process=process, acquired_at=now - SECOND, started_at=now - SECOND),
        LeaseFactory(process=process, expires_at=now - SECOND),
        LeaseFactory(process=other),
        LeaseFactory(process=process, expires_at=now - timedelta(hours=1)),
    ]
    released = LeaseFactory(process=process)
    Lease.objects.filter(pk=released.pk).update(outcome=Lease.Outcome.SUCCEEDED, released_at=now)
    return [*leases, released]


def test_marking_leases_started_marks_the_same(postgres, now, process):
    leases = held_leases(now, process)
    tokens = [lease.token for lease in leases]

    def started() -> list[tuple[int, bool]]:
        rows = Lease.objects.order_by("pk").values_list("pk", "started_at")
        return [(pk, at is not None) for pk, at in rows]  # each at its statement's clock

    (sql, sql_rows), (orm, orm_rows) = through_both(lambda b: b.mark_started(tokens), started)
    assert sql == orm and sql
    assert sql_rows == orm_rows


def test_a_heartbeat_extends_the_same_leases(postgres, now, process):
    leases = held_leases(now, process)
    tokens = [lease.token for lease in leases]
    held = Lease.objects.held().filter(process=process)  # as leases.heartbeat asks

    def extended(backend) -> list[int]:
        return sorted(backend.held_to_extend(held, tokens, process.pk).values_list("pk", flat=True))

    (sql, _), (orm, _) = through_both(extended, lambda: None)
    assert sql == orm and sql


def test_the_sweeper_finds_the_same_expired_leases(postgres, now, process):
    held_leases(now, process)

    def swept(backend) -> list[int]:
        return sorted(backend.expired_or_orphaned(now).values_list("pk", flat=True))

    (sql, _), (orm, _) = through_both(swept, lambda: None)
    assert sql == orm and len(sql) == 2


def test_a_filter_of_schedules_selects_the_same_runs(postgres, now):
    rows = claim_rows(now)
    ids = [rows["due"].schedule_id]

    def selected(backend) -> list[int]:
        return sorted(Run.objects.filter(backend.of_schedules(ids)).values_list("pk", flat=True))

    (sql, _), (orm, _) = through_both(selected, lambda: None)
    assert sql == orm and len(sql) == len(rows) - 1
    assert through_both(lambda b: list(Run.objects.filter(b.of_schedules([]))), lambda: None) == [
        ([], None),
        ([], None),
    ]


def started_runs(now) -> list[Schedule]:
    """Runs started over the last hours, first attempts and retries, some backfilled."""
    schedules = [ScheduleFactory(overlap=Overlap.CONCURRENT) for _ in range(3)]
    made = itertools.count()
    for n, schedule in enumerate(schedules):
        for minutes in range(0, 150, 7 + n):
            plan_time = now - timedelta(minutes=minutes, microseconds=next(made))
            lag = timedelta(milliseconds=(minutes * 37 + n * 11) % 900)
            RunFactory(
                schedule=schedule,
                plan_time=plan_time,
                status=RunStatus.SUCCEEDED,
                attempt=1 + minutes % 2,
                trigger="backfill" if minutes % 5 == 0 else "schedule",
                started_at=plan_time + lag,
                finished_at=plan_time + lag + SECOND,
                exclusive=False,
            )
    return schedules


def test_the_reads_agree(postgres, now):
    schedules = started_runs(now)
    ids = [schedule.pk for schedule in schedules]
    for read in (
        lambda b: [tuple(row) for row in b.recent_runs(ids, "default", 5)],
        lambda b: b.fire_lag(now - timedelta(hours=1), "default"),
        lambda b: b.run_series(now - timedelta(hours=2), now, "minute", "default"),
        lambda b: b.run_series(now - timedelta(hours=3), now, "hour", "default"),
    ):
        (sql, _), (orm, _) = through_both(read, lambda: None)
        assert sql == orm and sql


def run_rows(runs) -> list[dict]:
    """The runs' stored fields but their ids and schedule, in plan time and scope order."""
    unshared = {"id", "schedule_id"}
    fields = [f.attname for f in Run._meta.concrete_fields if f.attname not in unshared]
    return list(runs.order_by("plan_time", "scope").values(*fields))


def twin_schedules(**fields) -> tuple[Schedule, Schedule]:
    """Two schedules alike but for their names: one for a statement, one for its ORM path."""
    return tuple(ScheduleFactory(name=f"{twin}-{uuid.uuid4()}", **fields) for twin in "ab")


def schedule_settings() -> list[dict]:
    """Schedules' settings a new run reads: where it executes, its slot, its attempts."""
    settings = itertools.product(("", "dummy"), (Overlap.SKIP, Overlap.CONCURRENT), (1, 3))
    return [
        {"tasks_backend": backend, "overlap": overlap_policy, "max_attempts": attempts}
        for backend, overlap_policy, attempts in settings
    ]


def taken(row: dict) -> dict:
    """The fields of a run's row that it takes from its schedule."""
    return {name: row[name] for name in taken_from_schedule(Schedule())}


@pytest.mark.django_db
@pytest.mark.parametrize("tasks_backend", ["", "default"])  # the TASKS_BACKEND setting
def test_a_backfill_records_the_same_runs_through_the_statement_and_the_orm(
    postgres, now, settings, tasks_backend
):
    """The PostgreSQL backend's ``INSERT_SQL`` and the SQLite one's ORM record alike: runs
    awaiting their release (``AWAITING_RELEASE_VALUES``), not exclusive, with what they
    take from their schedule (``taken_from_schedule``)."""
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": tasks_backend}
    start, spacing = now - timedelta(hours=1), timedelta(seconds=2)
    for settings in schedule_settings():
        twins = twin_schedules(cron="*/10 * * * *", interval=None, timezone="UTC", **settings)
        inserts = (
            PostgreSQLLedger("default").insert_backfill,
            SQLiteLedger("default").insert_backfill,
        )
        for schedule, insert in zip(twins, inserts, strict=True):
            in_range = backfill._in_range(schedule, start, now, now)
            insert(schedule, in_range, now, spacing)
        rows = run_rows(Run.objects.filter(schedule=twins[0]))
        assert len(rows) == 6
        assert rows == run_rows(Run.objects.filter(schedule=twins[1]))
        expected = {**taken_from_schedule(twins[0]), "exclusive": False}
        assert all(taken(row) == expected for row in rows)
    assert all(run.awaits_release for run in Run.objects.all())


def loaded(schedule: Schedule) -> Due:
    """A schedule as the planner's ORM path loads it (with the snapshot's columns)."""
    rows = Schedule.objects.filter(pk=schedule.pk)
    rows = rows.annotate(
        anchor=F("created_at"), has_calendars=Value(False), has_overrides=Value(False)
    )
    fields = (*planner.DECISION_FIELDS, *SQLiteLedger.SNAPSHOT_COLUMNS_LOADED)
    return Due(*rows.values_list(*fields).get())


def fires_of_each_status(now) -> tuple[Fire, ...]:
    """A fire recorded in each status a decision gives: skipped, queued and pending (one
    moved by an override: released at its new time, timing/overridden.py)."""
    return (
        Fire(now - 2 * SECOND, RunStatus.SKIPPED, ErrorCode.MISSED, "missed"),
        Fire(now - SECOND, RunStatus.QUEUED),
        Fire(now, RunStatus.PENDING, release_at=now + 3 * SECOND),
    )


@pytest.mark.django_db
@pytest.mark.parametrize("tasks_backend", ["", "default"])  # the TASKS_BACKEND setting
def test_the_planners_statement_and_its_orm_path_record_the_same_runs(
    postgres, now, settings, tasks_backend
):
    """The PostgreSQL backend's ``PLAN_SQL`` and the SQLite one's ORM record a decision's
    fires alike, for twin schedules: with what a run takes from its schedule
    (``taken_from_schedule``), a skipped fire finished as it is recorded
    (``finished_when_recorded``), the others not."""
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": tasks_backend}
    by_sql, by_orm = [], []
    for settings in schedule_settings():
        sql, orm = (loaded(schedule) for schedule in twin_schedules(**settings))
        assert sql.next_fire_at is not None
        cursor = sql.next_fire_at + timedelta(hours=1)
        by_sql.append(Decision(sql, cursor, fires_of_each_status(now)))
        by_orm.append(Decision(orm, cursor, fires_of_each_status(now)))
    for backend, decisions in ((PostgreSQLLedger, by_sql), (SQLiteLedger, by_orm)):
        seen: recording.Seen = {}  # one batch's
        to_record = [recording.recorded(d, now, seen) for d in decisions]
        assert backend("default").record_fires(to_record, now, None) == decisions
    for sql, orm in zip(by_sql, by_orm, strict=True):
        rows = run_rows(Run.objects.filter(schedule_id=sql.schedule.pk))
        assert rows == run_rows(Run.objects.filter(schedule_id=orm.schedule.pk))
        finished = [row["finished_at"] for row in rows]
        assert finished == [finished_when_recorded(row["status"], now) for row in rows]
        assert finished == [now, None, None]  # skipped, queued, pending
        assert all(taken(row) == taken_from_schedule(sql.schedule) for row in rows)
        moved = rows[-1]  # released at its new time, its start deadline counted from it
        assert moved["release_at"] == now + 3 * SECOND
        assert moved["start_deadline"] == now + 3 * SECOND + sql.schedule.misfire_grace


def test_the_planners_orm_path_loads_every_schedule_field_a_run_copies():
    loaded = {*planner.DECISION_FIELDS, *SQLiteLedger.SNAPSHOT_COLUMNS_LOADED}
    assert set(COPIED_FROM_SCHEDULE.values()) <= loaded
    assert {"tasks_backend", "overlap"} <= loaded  # taken_from_schedule reads them too


@pytest.mark.django_db
def test_the_horizon_statement_and_its_orm_path_agree(postgres, now):
    schedule = ScheduleFactory()
    set_cursor(schedule, now + timedelta(seconds=5))
    for n, status in enumerate([RunStatus.PENDING, RunStatus.RETRYING, RunStatus.QUEUED]):
        RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=n), status=status,
                   next_retry_at=now + timedelta(seconds=7), exclusive=False)  # fmt: skip
        # Planned before the others, released after them: the release counts.
        RunFactory(schedule=schedule, plan_time=now - timedelta(seconds=n + 1), status=status,
                   release_at=now + timedelta(seconds=3), exclusive=False)  # fmt: skip
        RunFactory(schedule=schedule, plan_time=now + timedelta(seconds=10 + n), status=status,
                   tasks_backend="default", exclusive=False,
                   enqueued_at=now - timedelta(seconds=n) if n else None)  # fmt: skip
    LeaseFactory(expires_at=now + timedelta(seconds=30))
    by_sql = PostgreSQLLedger("default").look_ahead(fleet.local_jobs(), judge=False)
    by_orm = SQLiteLedger("default").look_ahead(fleet.local_jobs(), judge=False)
    assert by_sql.next_fire is not None and by_sql.next_enqueued is not None
    assert by_sql.next_pending == now  # not the plan time of the run released later
    assert {**vars(by_sql), "now": None} == {**vars(by_orm), "now": None}


def attempt_endings(now) -> list:
    """Every way an attempt ends (each outcome builder), one function of a claim each."""
    failure = records.Failure("ValueError", "boom", "Traceback: ...")
    return [
        lambda claim: outcomes.succeeded(claim, {"n": 1}),
        lambda claim: outcomes.succeeded(claim, None, started_at=now - SECOND),
        lambda claim: outcomes.failed(claim, failure),
        lambda claim: outcomes.failed(claim, replace(failure, retryable=False)),
        outcomes.timed_out,
        outcomes.cancelled,
        outcomes.skipped_late,
        outcomes.released,
        outcomes.unstarted,
        lambda claim: outcomes.not_storable(outcomes.succeeded(claim, 1), ValueError("no")),
    ]


@pytest.mark.django_db
def test_an_attempts_end_writes_the_same_through_the_statement_and_the_orm(postgres, now):
    """The PostgreSQL backend's ``OUTCOMES_SQL`` and the SQLite one's ORM write the same
    run and lease, for twin runs ended alike at the same time."""
    claims_made = itertools.count()

    def claimed(schedule: Schedule, max_attempts: int) -> Claim:
        run = RunFactory(
            schedule=schedule,
            plan_time=now - timedelta(minutes=1, microseconds=next(claims_made)),
            status=RunStatus.RUNNING,
            attempt=1,
            max_attempts=max_attempts,
            started_at=now - timedelta(seconds=5),
            exclusive=False,
        )
        return Claim.of(run, LeaseFactory(run=run).token)

    by_sql, by_orm = [], []
    for reentry in (False, True):
        schedule = ScheduleFactory(name=f"reentry-{reentry}", allow_stale_reentry=reentry)
        for end, max_attempts in itertools.product(attempt_endings(now), (1, 3)):
            outcome = end(claimed(schedule, max_attempts))  # its retry delay drawn once
            by_sql.append(outcome)
            by_orm.append(replace(outcome, claim=claimed(schedule, max_attempts)))
    by_sql_written = PostgreSQLLedger("default").record_outcomes(by_sql, now)
    assert by_sql_written == {o.claim.run.pk for o in by_sql}
    by_orm_written = SQLiteLedger("default").record_outcomes(by_orm, now)
    assert by_orm_written == {o.claim.run.pk for o in by_orm}
    unwritten = {"id", "plan_time", "created_at"}
    fields = [f.attname for f in Run._meta.concrete_fields if f.attname not in unwritten]
    for sql, orm in zip(by_sql, by_orm, strict=True):
        assert Run.objects.values(*fields).get(pk=sql.claim.run.pk) == Run.objects.values(
            *fields
        ).get(pk=orm.claim.run.pk), sql.status
        lease = ("released_at", "outcome", "process_id")
        assert Lease.objects.values(*lease).get(token=sql.claim.token) == Lease.objects.values(
            *lease
        ).get(token=orm.claim.token)
    statuses = {o.status for o in by_sql}
    assert statuses == set(RunStatus) - {RunStatus.QUEUED, RunStatus.RUNNING}
