"""Where SQL restates a Python rule, it is built from that rule: here the two must agree.

Each test states the rule once in Python (a property, a function, a Q) and checks the
rows its SQL form selects, or writes, on every combination of the columns it reads.
"""

import itertools
import uuid
from datetime import timedelta

import pytest
from django.db import connection

from django_periodic import registry
from django_periodic.choices import (
    KIND_FIELDS,
    LEDGER_TRIGGERS,
    UNSET_TRIGGER,
    RunStatus,
    RunTrigger,
    ScheduleKind,
)
from django_periodic.db import clock
from django_periodic.db.postgresql import HELD_SQL
from django_periodic.engine import overlap, records
from django_periodic.engine.backends.postgresql import claims as pg_claims
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.planning import planner
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import retries
from django_periodic.models import Lease, Run, Schedule
from django_periodic.models.processes import held_through
from django_periodic.models.run import (
    AWAITING_RELEASE,
    RELEASE,
    SNAPSHOT_FIELDS,
    past_start_deadline,
    past_start_deadline_filter,
)
from django_periodic.models.trigger_rows import ANCHORED_AT_CREATION, kind_of
from django_periodic.timing import bounds
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory
from tests.helpers import set_cursor

START = clock.wall_now().replace(microsecond=0)
SECOND = timedelta(seconds=1)


def every_trigger_combination() -> list[Schedule]:
    """One stored row per combination of the trigger columns, valid or not (as update()
    or bulk_create() may store them)."""
    rows = []
    combinations = itertools.product(
        ("", "* * * * *"),
        (None, timedelta(minutes=1)),
        (None, START),
        ("", "FREQ=DAILY"),
        (None, START),
    )
    for n, (cron, interval, run_at, rrule, start_at) in enumerate(combinations):
        schedule = ScheduleFactory(name=f"kind-{n}", interval=timedelta(minutes=1))
        Schedule.objects.filter(pk=schedule.pk).update(
            cron=cron, interval=interval, run_at=run_at, rrule=rrule, start_at=start_at
        )
        rows.append(Schedule.objects.get(pk=schedule.pk))
    return rows


@pytest.mark.django_db
def test_the_kind_filters_select_the_rows_of_each_kind():
    rows = every_trigger_combination()
    for kind in ScheduleKind:
        selected = set(Schedule.objects.of_kind(kind).values_list("pk", flat=True))
        assert selected == {row.pk for row in rows if kind_of(row) == kind}, kind


@pytest.mark.django_db
def test_the_rows_anchored_at_creation_are_those_whose_trigger_reads_created_at():
    rows = every_trigger_combination()
    selected = set(Schedule.objects.filter(ANCHORED_AT_CREATION).values_list("pk", flat=True))
    reads_created_at = {
        row.pk for row in rows if kind_of(row) == ScheduleKind.INTERVAL and row.start_at is None
    }
    assert selected == reads_created_at


def test_an_unset_trigger_field_is_the_schedules_default_and_makes_no_kind():
    """``UNSET_TRIGGER`` (code-defined and imported schedules, the admin's form) holds the
    fields of ``KIND_FIELDS`` (@job's ``TRIGGER_OPTIONS``) as a schedule stores them unset."""
    assert registry.TRIGGER_OPTIONS == tuple(KIND_FIELDS.values()) == tuple(UNSET_TRIGGER)
    for name, unset in UNSET_TRIGGER.items():
        assert Schedule._meta.get_field(name).get_default() == unset, name
    assert kind_of(Schedule(**UNSET_TRIGGER)) == ""
    for kind, name in KIND_FIELDS.items():
        set_one = {
            "cron": "* * * * *",
            "interval": timedelta(minutes=1),
            "run_at": START,
            "rrule": "FREQ=DAILY",
            "after": ["upstream"],
        }
        assert kind_of(Schedule(**{**UNSET_TRIGGER, name: set_one[name]})) == kind


def every_release_combination(schedule: Schedule) -> list[Run]:
    """One run per trigger, status and attempt (0 or 1) that the awaiting rule reads."""
    combinations = itertools.product(RunTrigger, RunStatus, (0, 1))
    return [
        RunFactory(
            schedule=schedule,
            plan_time=START + timedelta(seconds=n),
            trigger=trigger,
            status=status,
            attempt=attempt,
            exclusive=False,  # many active runs of one schedule: the slot is not the point
        )
        for n, (trigger, status, attempt) in enumerate(combinations)
    ]


@pytest.mark.django_db
def test_awaiting_release_is_one_rule_as_a_property_and_as_a_query():
    runs = every_release_combination(ScheduleFactory())
    selected = set(Run.objects.filter(AWAITING_RELEASE).values_list("pk", flat=True))
    assert selected == {run.pk for run in runs if run.awaits_release}
    assert selected  # the combinations hold some


@pytest.mark.django_db
def test_a_rule_compiled_for_a_statement_selects_what_its_query_selects(postgres):
    runs = every_release_combination(ScheduleFactory())
    table = connection.ops.quote_name(Run._meta.db_table)
    condition, params = rules.condition(Run.objects.filter(AWAITING_RELEASE), "awaiting")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE {condition}", params)
        selected = {pk for (pk,) in cursor.fetchall()}
    assert selected == {run.pk for run in runs if run.awaits_release}


def test_the_ledger_conflict_target_is_the_ledger_constraint():
    (constraint,) = [
        c for c in Run._meta.constraints if c.name == "periodic_run_once_per_plan_time"
    ]
    columns = ", ".join(Run._meta.get_field(name).column for name in constraint.fields)
    assert constraint.condition.children == [("trigger__in", LEDGER_TRIGGERS)]
    quoted = ", ".join(f"'{trigger}'" for trigger in LEDGER_TRIGGERS)
    assert rules.ledger_conflict() == f"({columns}) WHERE trigger IN ({quoted})"


@pytest.mark.django_db(transaction=True)
def test_a_planned_run_and_its_retry_carry_the_snapshot_of_their_schedule():
    """The planner's statement (PostgreSQL) and its ORM path (SQLite) copy SNAPSHOT_FIELDS."""
    now = clock.now()
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], kwargs={"c": 3})
    Schedule.objects.filter(pk=schedule.pk).update(args=[4, 5])  # revision 2
    schedule.refresh_from_db()
    set_cursor(schedule, now)
    planner.plan_due(now)
    run = Run.objects.get(schedule=schedule)
    assert run.snapshot == {field: getattr(schedule, of) for field, of in SNAPSHOT_FIELDS.items()}
    assert run.snapshot["schedule_revision"] == 2
    Schedule.objects.filter(pk=schedule.pk).update(args=[6, 7])
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    run.refresh_from_db()
    assert retries.plan_retry(run, now).snapshot == run.snapshot


def every_start_combination(now) -> list[Run]:
    """One run per status, attempt (0 or 1) and start deadline (none, past, now, future)."""
    schedule = ScheduleFactory()
    deadlines = (None, now - SECOND, now, now + SECOND)
    combinations = itertools.product(RunStatus, (0, 1), deadlines)
    return [
        RunFactory(
            schedule=schedule,
            status=status,
            attempt=attempt,
            start_deadline=deadline,
            plan_time=now - timedelta(minutes=1) + timedelta(microseconds=n),
            exclusive=False,
        )
        for n, (status, attempt, deadline) in enumerate(combinations)
    ]


@pytest.mark.django_db
def test_too_late_to_start_is_one_rule_as_a_method_and_as_a_query(now):
    runs = every_start_combination(now)
    selected = set(Run.objects.too_late_to_start(now).values_list("pk", flat=True))
    assert selected == {run.pk for run in runs if run.too_late_to_start(now)}
    assert len(selected) == 1  # pending, attempt 0, deadline before now


@pytest.mark.django_db
def test_the_start_deadline_filter_selects_the_runs_past_their_start_deadline(now):
    """``past_start_deadline_filter`` (too_late_to_start, and fleet.py's skip of runs of
    any waiting status) is ``past_start_deadline`` as a query."""
    runs = every_start_combination(now)
    selected = set(Run.objects.filter(past_start_deadline_filter(now)).values_list("pk", flat=True))
    assert selected == {run.pk for run in runs if past_start_deadline(run.start_deadline, now)}
    assert selected


@pytest.mark.django_db
def test_the_claim_statement_skips_the_runs_the_queryset_calls_too_late(postgres, now):
    every_start_combination(now)
    table = connection.ops.quote_name(Run._meta.db_table)
    late, params = pg_claims._too_late("default")
    sql = (
        f"WITH t AS (SELECT %(now)s::timestamptz AS now) SELECT r.id FROM {table} r"
        f" CROSS JOIN t WHERE {late}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {"now": now, **params})
        selected = {pk for (pk,) in cursor.fetchall()}
    assert selected == set(Run.objects.too_late_to_start(now).values_list("pk", flat=True))
    assert selected


def test_a_claimed_run_is_too_late_when_its_run_was_before_the_claim():
    """Claim.too_late judges a run once claimed (running, attempt 1) as too_late_to_start
    judged it before (pending, attempt 0)."""
    at = START
    for deadline in (None, at - SECOND, at, at + SECOND):
        waiting = Run(status=RunStatus.PENDING, attempt=0, start_deadline=deadline)
        claimed = Run(
            status=RunStatus.RUNNING, attempt=1, start_deadline=deadline, schedule=Schedule()
        )
        assert Claim.of(claimed, uuid.uuid4()).too_late(at) == waiting.too_late_to_start(at)
    retried = Run(
        status=RunStatus.RUNNING, attempt=2, start_deadline=at - SECOND, schedule=Schedule()
    )
    assert not Claim.of(retried, uuid.uuid4()).too_late(at)  # only a first start is judged


@pytest.mark.django_db
def test_the_claim_statement_refuses_the_leases_can_lease_refuses(postgres, now):
    edge = bounds.LATEST - now  # the longest lease_timeout whose lease still ends in range
    timeouts = (timedelta(minutes=5), edge - timedelta(microseconds=1), edge, edge + SECOND)
    sql = (
        "WITH t AS (SELECT %(now)s::timestamptz AS now),"
        " s AS (SELECT %(lease_timeout)s::interval AS lease_timeout)"
        f" SELECT {pg_claims.UNLEASABLE} FROM s CROSS JOIN t"
    )
    with connection.cursor() as cursor:
        for lease_timeout in timeouts:
            params = {"now": now, "lease_timeout": lease_timeout, "latest": bounds.LATEST}
            cursor.execute(sql, params)
            (unleasable,) = cursor.fetchone()
            assert unleasable == (not records.can_lease(lease_timeout, now)), lease_timeout
    assert records.can_lease(timeouts[1], now) and not records.can_lease(timeouts[2], now)


@pytest.mark.django_db
def test_the_release_time_is_one_rule_as_a_property_an_expression_and_in_the_claim(postgres):
    schedule = ScheduleFactory()
    staggers = (None, -SECOND, SECOND)  # none, and a release before or after the plan time
    runs = []
    for n, stagger in enumerate(staggers):
        plan_time = START + timedelta(minutes=n)
        release_at = None if stagger is None else plan_time + stagger
        run = RunFactory(
            schedule=schedule, plan_time=plan_time, release_at=release_at, exclusive=False
        )
        runs.append(run)
    by_property = {run.pk: run.release_time for run in runs}
    by_expression = dict(Run.objects.annotate(release=RELEASE).values_list("pk", "release"))
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT r.id, {pg_claims.RELEASE} FROM {table} r")
        by_claim = dict(cursor.fetchall())
    assert by_property == by_expression == by_claim


def every_claim_combination(now) -> list[Run]:
    """One run per status, plan time (past, soon, later), stagger (none, released soon or
    later) and retry time (none, past, future), for our workers and for a tasks backend's."""
    schedule = ScheduleFactory()
    times = (now - timedelta(minutes=1), now + timedelta(seconds=1), now + timedelta(hours=1))
    staggers = (None, timedelta(seconds=62), timedelta(hours=2))
    retries = (None, now - timedelta(seconds=1), now + timedelta(seconds=30))
    combinations = itertools.product(RunStatus, times, staggers, retries, ("", "default"))
    return [
        RunFactory(
            schedule=schedule,
            status=status,
            next_retry_at=retry,
            tasks_backend=backend,
            plan_time=plan_time + timedelta(microseconds=n),
            release_at=stagger and plan_time + stagger,
            exclusive=False,
        )
        for n, (status, plan_time, stagger, retry, backend) in enumerate(combinations)
    ]


def claimed_by_sql(condition: str, now, ahead: timedelta) -> set[int]:
    table = connection.ops.quote_name(Run._meta.db_table)
    sql = (
        f"WITH t AS (SELECT %(now)s::timestamptz AS now) SELECT r.id FROM {table} r "
        f"WHERE {condition} AND {pg_claims.EXECUTED_HERE}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {"now": now, "ahead": ahead})
        return {pk for (pk,) in cursor.fetchall()}


@pytest.mark.django_db
def test_the_claim_statement_takes_the_runs_the_queryset_calls_claimable(postgres, now):
    every_claim_combination(now)
    ahead = timedelta(seconds=5)
    runs = Run.objects.executed_here()
    claimable = set(runs.claimable(now).values_list("pk", flat=True))
    coming = set(runs.coming(now, ahead).values_list("pk", flat=True))
    assert claimable and coming
    assert claimed_by_sql(pg_claims.CLAIMABLE_NOW, now, ahead) == claimable
    assert claimed_by_sql(pg_claims.CLAIMABLE_AHEAD, now, ahead) == coming


@pytest.mark.django_db
def test_the_paused_schedules_are_those_whose_pause_holds_at_now():
    now = clock.now()
    untils = (None, now - SECOND, now, now + SECOND)
    rows = []
    for n, until in enumerate(untils):
        schedule = ScheduleFactory(name=f"paused-{n}")
        Schedule.objects.filter(pk=schedule.pk).update(paused_until=until)
        rows.append(Schedule.objects.get(pk=schedule.pk))
    selected = set(Schedule.objects.paused(now).values_list("pk", flat=True))
    assert selected == {row.pk for row in rows if row.is_paused(now)}
    assert len(selected) == 1  # the pause ending after now; one ending at now holds no more


def leases_held_and_released(now) -> list[Lease]:
    """Leases held, and released with each outcome, of their own runs."""
    leases = [LeaseFactory(expires_at=now + timedelta(seconds=30)) for _ in range(2)]
    for outcome in Lease.Outcome:
        lease = LeaseFactory(expires_at=now + timedelta(seconds=30))
        Lease.objects.filter(pk=lease.pk).release(now, outcome)
        leases.append(Lease.objects.get(pk=lease.pk))
    return leases


@pytest.mark.django_db
def test_the_statements_held_leases_are_the_querysets(postgres, now):
    leases = leases_held_and_released(now)
    table = connection.ops.quote_name(Lease._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT l.id FROM {table} l WHERE {HELD_SQL}")
        selected = {pk for (pk,) in cursor.fetchall()}
    held = set(Lease.objects.held().values_list("pk", flat=True))
    assert selected == held == {lease.pk for lease in leases if lease.released_at is None}
    assert held


@pytest.mark.django_db
def test_a_lease_held_through_a_relation_is_one_the_queryset_calls_held(now):
    leases = leases_held_and_released(now)
    runs = set(Run.objects.filter(held_through("leases")).values_list("pk", flat=True))
    assert runs == set(Lease.objects.held().values_list("run_id", flat=True))
    assert len(runs) < len(leases)


@pytest.mark.django_db
def test_the_planners_filter_leaves_out_the_schedules_its_rule_says_wait_for_their_due_time():
    """``planner._without_waiting`` restates ``_waits_for_due_time``: a fire within the lead
    waits while a run of the schedule, of any status in flight, is."""
    now = clock.now()
    statuses = [None, *RunStatus]
    rows = []
    for n, (cursor, status) in enumerate(itertools.product((now, now + SECOND), statuses)):
        schedule = ScheduleFactory(name=f"in-flight-{n}", interval=timedelta(minutes=1))
        set_cursor(schedule, cursor)
        if status is not None:
            RunFactory(schedule=schedule, plan_time=now - timedelta(minutes=1), status=status)
        rows.append(schedule)
    due = Schedule.objects.due(now + SECOND)
    plannable = planner._without_waiting(due, now)
    loaded = {s.pk: s for s in planner._locked(due, len(rows), connection.alias)[0]}
    occupancy = overlap.occupancy(Run.objects.all(), list(loaded))
    judged = {pk for pk, s in loaded.items() if planner._waits_for_due_time(s, now, occupancy)}
    assert judged
    assert set(plannable.values_list("pk", flat=True)) == set(loaded) - judged
