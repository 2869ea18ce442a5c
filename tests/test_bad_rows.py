"""Bad rows: whatever a row holds, however it was stored, it fails alone.

A value the database's checks refuse can still be in a row: stored before the checks
existed, or past them. These tests drop the schedule table's CHECK constraints (in their
own transaction) to store such values, and show that the engine fails that one schedule
or run with a clear error while the others plan, claim and run. The property-based test
at the end writes random rows every way a row can be written beside healthy schedules,
and checks that a real scheduler keeps running them.
"""

import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from django_periodic.db import clock
from django_periodic.engine import records
from django_periodic.engine.loop.scheduler import look_ahead
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from django_periodic.timing import bounds
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory
from tests.processes import wait_for

SCHEDULE_TABLE = Schedule._meta.db_table
LONG_AGO = timedelta(hours=1)


def check_constraints() -> dict[str, str]:
    """The schedule table's CHECK constraints: name -> definition (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c'",
            [SCHEDULE_TABLE],
        )
        return dict(cursor.fetchall())


def drop_check_constraints() -> dict[str, str]:
    """Drop the schedule table's CHECK constraints; return them, to be added back."""
    dropped = check_constraints()
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        # The deferred checks of schedules inserted in this transaction (its foreign key to
        # a concurrency limit) run now: PostgreSQL alters no table with checks pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for name in dropped:
            cursor.execute(f"ALTER TABLE {quote(SCHEDULE_TABLE)} DROP CONSTRAINT {quote(name)}")
    return dropped


@pytest.fixture
def unchecked(db):
    """Rows may hold what the schedule table's CHECK constraints refuse, for this test."""
    if connection.vendor == "postgresql":
        drop_check_constraints()  # in the test's transaction: rolled back after it
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA ignore_check_constraints = ON")
    yield
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA ignore_check_constraints = OFF")


@contextlib.contextmanager
def committed_without_checks():
    """The same for tests of real processes, which see committed rows only: the
    constraints come back after the test, once the rows that break them are gone."""
    dropped = drop_check_constraints()
    try:
        yield
    finally:
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {quote(SCHEDULE_TABLE)} CASCADE")
            for name, definition in dropped.items():
                table, name = quote(SCHEDULE_TABLE), quote(name)
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")


@pytest.fixture
def unchecked_for_children(postgres, children):
    with committed_without_checks():
        yield


@pytest.fixture(params=["checked", "unchecked"])
def door(request, postgres, children):
    """Whether the database checks the rows written (rejecting many at the door), or
    lets every value in, as a table without the checks would."""
    if request.param == "checked":
        yield
        return
    with committed_without_checks():
        yield


def set_raw(schedule: Schedule, **literals: str) -> None:
    """Write columns of ``schedule`` with SQL literals, as raw SQL would: values Python
    itself cannot hold (a year past 9999, an interval of 10**9 days)."""
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(column)} = %s" for column in literals)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(SCHEDULE_TABLE)} SET {assignments} WHERE id = %s",
            [*literals.values(), schedule.pk],
        )


def test_a_run_whose_lease_would_outlast_time_fails_and_the_next_is_claimed(
    unchecked, process, now
):
    # On PostgreSQL the claim wrote a lease expiring in the year 275,817 (which no look
    # ahead could read after that); elsewhere it raised OverflowError.
    bad = ScheduleFactory(overlap="queue")
    Schedule.objects.filter(pk=bad.pk).update(lease_timeout=timedelta(days=10**8))
    doomed = RunFactory(schedule=bad, plan_time=now - LONG_AGO)
    behind = RunFactory(schedule=bad, plan_time=now - LONG_AGO / 2, status="queued")
    good = RunFactory(plan_time=now)
    claimed = claims.claim(process, None, 10)
    assert [claim.run.pk for claim in claimed] == [good.pk]
    doomed.refresh_from_db()
    assert (doomed.status, doomed.error_code) == ("failed", "cannot_claim")
    assert "lease_timeout" in doomed.error_message and doomed.finished_at is not None
    assert not Lease.objects.filter(run=doomed).exists()
    behind.refresh_from_db()
    # The failed run's slot went to the one queued behind, which could not be claimed either.
    assert (behind.status, behind.error_code) == ("failed", "cannot_claim")


def test_the_claim_statement_says_what_can_lease_says(unchecked, process):
    # CLAIM_SQL restates records.can_lease; both must draw the line at the same microsecond.
    now = clock.now()
    edge = bounds.LATEST - now
    for lease_timeout in (edge - timedelta(microseconds=1), edge):
        schedule = ScheduleFactory()
        Schedule.objects.filter(pk=schedule.pk).update(lease_timeout=lease_timeout)
        run = RunFactory(schedule=schedule, plan_time=now - LONG_AGO)
        claimed = claims.claim(process, now, 1)
        run.refresh_from_db()
        if records.can_lease(lease_timeout, now):
            assert [claim.run.pk for claim in claimed] == [run.pk]
            assert Lease.objects.get(run=run).expires_at == bounds.LATEST - timedelta(
                microseconds=1
            )
        else:
            assert claimed == [] and run.error_code == "cannot_claim"


def test_a_claim_the_database_refuses_for_one_run_fails_that_run_alone(postgres, process, now):
    # Any row the claim statement trips on (here a trigger refuses its lease) fails the
    # whole statement: the runs are claimed again one at a time to find it.
    refused = RunFactory(plan_time=now - LONG_AGO)
    others = [RunFactory(plan_time=now - LONG_AGO / 2) for _ in range(2)]
    lease_table = connection.ops.quote_name(Lease._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION pg_temp.refuse_lease() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.run_id = {refused.pk} THEN RAISE EXCEPTION 'not this one';"
            " END IF; RETURN NEW; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER refuse_lease BEFORE INSERT ON {lease_table}"
            " FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_lease()"
        )
    claimed = claims.claim(process, None, 10)
    assert sorted(claim.run.pk for claim in claimed) == [run.pk for run in others]
    refused.refresh_from_db()
    assert (refused.status, refused.error_code) == ("failed", "cannot_claim")
    assert "not this one" in refused.error_message


def test_a_row_python_cannot_load_fails_alone_and_its_batch_is_planned(unchecked, postgres):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    healthy = [ScheduleFactory(interval=timedelta(seconds=10), start_at=t0) for _ in range(3)]
    bad = ScheduleFactory(interval=timedelta(seconds=10), start_at=t0)
    Schedule.objects.update(next_fire_at=t0)
    set_raw(bad, end_at="20000-01-01 00:00:00+00")  # Python's datetime ends in 9999
    result = planner.plan_due(t0)
    assert (result.fired, result.failed) == (3, [bad.name])
    for schedule in healthy:
        assert Run.objects.filter(schedule=schedule, plan_time=t0).exists()
    failures, error = Schedule.objects.filter(pk=bad.pk).values_list(
        "planning_failures", "last_error"
    )[0]
    assert failures == 1 and "cannot be loaded" in error


def test_the_look_ahead_holds_times_python_cannot(unchecked, postgres):
    # One such time made every look ahead fail: the scheduler was up, and did nothing.
    LeaseFactory()
    set_raw(ScheduleFactory(), next_fire_at="4000-01-01 00:00:00+00 BC")
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(Lease._meta.db_table)
        cursor.execute(f"UPDATE {table} SET expires_at = '275817-08-07 00:00:00+00'")
    ahead = look_ahead()
    assert (ahead.next_fire, ahead.next_expiry) == (bounds.EARLIEST, bounds.LATEST)


@pytest.mark.processes
def test_a_scheduler_outlives_a_run_it_cannot_watch(unchecked_for_children, children):
    # started_at + timeout overflowed in the loop's watch (a non-database error): the
    # process died. Now the run is watched no more, and ends as its job does.
    schedule = ScheduleFactory(job="tests.jobs.linger", kwargs={"seconds": 1})
    Schedule.objects.filter(pk=schedule.pk).update(
        timeout=timedelta(days=10**8), next_fire_at=clock.now()
    )
    child = children.start("--workers", "1")
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    wait_for(done.exists, 30, "the run to succeed")
    assert child.popen.poll() is None, child.output()
    assert child.terminate() == 0


# What the property-based test writes: for each column, values a row may hold however it
# was stored. Many are out of range (the database's checks may refuse them: "rejected at
# the door", which is fine), some are legal but odd. Jobs are quick: a legal schedule that
# keeps every worker busy for minutes starves the others by design, not by a bad row.
NOW = datetime.now(UTC)
BAD_VALUES = {
    "job": ["tests.jobs.noop", "tests.jobs.explode", "tests.jobs.removed_from_code", ""],
    "args": [[], [1, 2, 3], {"not": "a list"}, "text"],
    "kwargs": [{}, {"unexpected": 1}, ["not", "a", "dict"]],
    "scopes": ["", "tests.scopes.no_such_provider"],
    "cron": ["", "* * * * *", "61 * * * *", "@reboot", "not a cron"],
    "timezone": ["UTC", "Mars/Olympus", ""],
    "interval": [
        None, timedelta(microseconds=1), timedelta(0), timedelta(seconds=-1),
        timedelta(seconds=1), timedelta(days=10**8), timedelta.max,
    ],
    "run_at": [None, NOW - LONG_AGO, NOW + timedelta(seconds=1), bounds.EARLIEST],
    "start_at": [None, NOW + timedelta(days=1), datetime(1, 1, 2, tzinfo=UTC)],
    "end_at": [None, NOW - LONG_AGO, datetime(9999, 12, 30, tzinfo=UTC)],
    "next_fire_at": [None, bounds.UNPLANNED, NOW - timedelta(days=365), bounds.EARLIEST],
    "overlap": ["skip", "queue", "concurrent", "sometimes"],
    "max_queued": [0, 2**31 - 1],
    "max_concurrent": [None, 0, 2**31 - 1],
    "misfire": ["latest", "all", "skip", "never"],
    "misfire_grace": [timedelta(0), timedelta(seconds=-5), timedelta(days=999_999), timedelta.max],
    "max_attempts": [0, 1, 3],
    "retry_backoff": [timedelta(0), timedelta(seconds=-1), timedelta(days=10**8)],
    "timeout": [None, timedelta(microseconds=1), timedelta(seconds=-1), timedelta(days=10**8)],
    "lease_timeout": [timedelta(microseconds=1), timedelta(0), timedelta(days=10**8)],
    "tasks_backend": ["", "no-such-alias", "dummy"],
    "planning_failures": [0, 2**31 - 1],
}  # fmt: skip
# ...and, through raw SQL, values Python cannot even load.
RAW_VALUES = {
    "interval": ["1000000000 days", "-1 second"],
    "misfire_grace": ["1000000000 days"],
    "end_at": ["20000-01-01 00:00:00+00"],
    "start_at": ["0001-01-01 00:00:00+00 BC"],
    "next_fire_at": ["4000-01-01 00:00:00+00 BC", "20000-01-01 00:00:00+00"],
}
# The rows that stopped or starved two schedulers, first of all.
FOUND = [
    ("update", {"interval": timedelta(microseconds=1), "overlap": "concurrent"}),
    ("update", {"misfire_grace": timedelta(days=999_999)}),
    ("update", {"tasks_backend": "no-such-alias"}),
    ("update", {"lease_timeout": timedelta(days=10**8)}),
]
# Writing a row may be refused: by the database (a CHECK, a type's range), or by save().
REJECTED = (DatabaseError, ValueError, OverflowError, TypeError)


def columns_from(values: dict[str, list]) -> st.SearchStrategy[dict]:
    """A few columns of a row, each with one of its values."""
    names = st.sets(st.sampled_from(sorted(values)), min_size=1, max_size=4)
    return names.flatmap(
        lambda chosen: st.fixed_dictionaries(
            {name: st.sampled_from(values[name]) for name in chosen}
        )
    )


BAD_ROWS = st.one_of(
    st.tuples(st.sampled_from(["create", "update", "bulk_create"]), columns_from(BAD_VALUES)),
    st.tuples(st.just("raw"), columns_from(RAW_VALUES)),
)


def write(how: str, columns: dict, name: str) -> Schedule | None:
    """Store a schedule ``how`` a user might; None if that was refused."""
    base = {"name": name, "job": "tests.jobs.noop", "interval": timedelta(seconds=1)}
    try:
        with transaction.atomic():
            if how == "create":
                return Schedule.objects.create(**(base | columns))
            if how == "bulk_create":
                return Schedule.objects.bulk_create([Schedule(**(base | columns))])[0]
            schedule = Schedule.objects.create(**base)
            if how == "update":
                Schedule.objects.filter(pk=schedule.pk).update(**columns)
            else:
                set_raw(schedule, **columns)
            return schedule
    except REJECTED:
        return None  # rejected at the door


@pytest.mark.processes
def test_no_bad_row_stops_a_scheduler_or_starves_the_others(door, children):
    """Random rows, written every way, beside five healthy schedules firing every second:
    the scheduler stays up, each healthy schedule keeps succeeding, and a graceful stop
    leaves nothing running."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=1)
    healthy = ScheduleFactory.create_batch(
        5, job="tests.jobs.record", interval=timedelta(seconds=1), start_at=start
    )
    fast = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1, "SHUTDOWN_GRACE": 2}
    child = children.start("--workers", "4", settings=fast)
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    written = []

    @settings(
        max_examples=8,
        deadline=None,
        database=None,
        # A failing example is reported as found: shrinking would cost minutes of waiting.
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(rows=st.lists(BAD_ROWS, min_size=1, max_size=3))
    @example(rows=FOUND)
    def bad_rows_fail_alone(rows):
        for how, columns in rows:
            schedule = write(how, columns, f"bad-{len(written)}")
            written.append((how, columns, schedule is not None))
        since = clock.now()
        for schedule in healthy:
            ran = Run.objects.filter(schedule=schedule, status="succeeded", plan_time__gt=since)
            wait_for(ran.exists, 15, f"{schedule.name} to succeed again after {rows}")
        assert child.popen.poll() is None, f"the scheduler died after {rows}"

    try:
        bad_rows_fail_alone()
    except BaseException:
        with contextlib.suppress(Exception):
            child.terminate(timeout=10)
        print(child.output()[-5000:])
        raise
    assert child.terminate() == 0, child.output()[-5000:]
    assert not Run.objects.running().exists(), list(Run.objects.running().values())
    assert any(stored for _, _, stored in written), "every row was rejected: nothing tested"
