"""Every bounded field of a schedule (bounds.SCHEDULE) keeps its range on every path:
``clean()``, the database's CHECK constraints (``update()``, raw SQL), the trigger built
from a row (MIN_INTERVAL), and the docs that list the ranges. Rows stored without save()
get the UNPLANNED cursor."""

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic import conf
from django_periodic.db import clock
from django_periodic.engine.planning import planner
from django_periodic.models import Schedule
from django_periodic.timing import bounds, triggers
from django_periodic.timing.bounds import CENTURY, EARLIEST, LATEST, UNPLANNED
from tests.factories import ScheduleFactory, due_row

T0 = datetime(2026, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "semantics.md"


def step(value):
    """The smallest change of a value of this type."""
    return 1 if isinstance(value, int) else US


def outside(valid: bounds.Range) -> list:
    """The values just outside each end of a range."""
    below = valid.low if valid.low_open else valid.low - step(valid.low)
    above = valid.high if valid.high_open else valid.high + step(valid.high)
    return [below, above]


def ends(valid: bounds.Range) -> list:
    """The values at each end of a range that are still in it."""
    low = valid.low + step(valid.low) if valid.low_open else valid.low
    high = valid.high - step(valid.high) if valid.high_open else valid.high
    return [low, high]


def cases(values_of) -> list:
    return [
        pytest.param(name, value, id=f"{name}-{side}")
        for name, valid in bounds.SCHEDULE.items()
        for side, value in zip(("low", "high"), values_of(valid), strict=True)
    ]


# The values that the issue found accepted on main, each of which broke something.
FOUND_ON_MAIN = [
    pytest.param("misfire_grace", timedelta(days=999_999), id="never-skip-grace"),
    pytest.param("interval", timedelta(microseconds=1), id="microsecond-interval"),
    pytest.param("lease_timeout", timedelta(days=10**8), id="lease-past-postgresql"),
    pytest.param(
        "run_at", datetime(9999, 12, 31, 20, tzinfo=ZoneInfo("Pacific/Kiritimati")), id="year-9999"
    ),
]
OUTSIDE = cases(outside) + FOUND_ON_MAIN


def fields_with(name: str, value) -> dict:
    """A valid schedule's fields, with ``name`` set to ``value`` (a one-shot for run_at, a
    daily cron for jitter, which an interval must exceed)."""
    fields = {"name": "s", "job": "tests.jobs.noop", "interval": timedelta(minutes=1)}
    if name == "run_at":
        fields["interval"] = None
    if name == "jitter":
        fields.update(interval=None, cron="@daily")
    return {**fields, name: value}


def saved_for(name: str) -> Schedule:
    """A valid schedule whose ``name`` field a test then sets past clean()."""
    if name == "run_at":
        return ScheduleFactory(interval=None, run_at=T0)
    return ScheduleFactory()


# -- clean() ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), OUTSIDE)
def test_clean_refuses_each_value_out_of_range_on_its_field(name, value):
    with pytest.raises(ValidationError) as raised:
        Schedule(**fields_with(name, value)).full_clean()
    assert list(raised.value.message_dict) == [name]


# lease_timeout's range starts at 1 µs, but clean() also wants twice HEARTBEAT_INTERVAL,
# which is at least 1 µs: no setting lets clean() accept that end (tested below).
CLEAN_ENDS = [case for case in cases(ends) if case.id != "lease_timeout-low"]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), CLEAN_ENDS)
def test_clean_accepts_the_ends_of_each_range(settings, name, value):
    # The settings ask more of two fields: the interval, MIN_INTERVAL (1 s by default); the
    # lease, twice HEARTBEAT_INTERVAL (below, and in test_models).
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": bounds.INTERVAL_FLOOR}
    Schedule(**fields_with(name, value)).full_clean()


@pytest.mark.django_db
def test_the_shortest_lease_is_twice_the_shortest_heartbeat(settings):
    heartbeat = ends(conf.RANGES["HEARTBEAT_INTERVAL"])[0]
    settings.DJANGO_PERIODIC = {"HEARTBEAT_INTERVAL": heartbeat}
    lowest = ends(bounds.SCHEDULE["lease_timeout"])[0]
    assert heartbeat == lowest == US
    # The range's own end is refused by the heartbeat rule alone; twice the heartbeat passes.
    with pytest.raises(ValidationError) as raised:
        Schedule(**fields_with("lease_timeout", lowest)).full_clean()
    assert raised.value.message_dict == {
        "lease_timeout": [
            "lease_timeout must be at least twice the heartbeat interval (0:00:00.000001), "
            "or a live process could lose its lease."
        ]
    }
    Schedule(**fields_with("lease_timeout", 2 * heartbeat)).full_clean()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("misfire_grace", timedelta(days=999_999), "misfire_grace must be at most 36525 days."),
        ("misfire_grace", -US, "misfire_grace must not be negative."),
        ("timeout", timedelta(0), "timeout must be positive."),
        ("retry_backoff", timedelta(hours=13), "retry_backoff must be at most 12 hours."),
        ("max_attempts", 0, "max_attempts must be at least 1."),
        ("keep_runs", 10**7, "keep_runs must be at most 1000000."),
        ("end_at", LATEST, "end_at must be before 9000-01-01 00:00 UTC."),
        ("start_at", EARLIEST - US, "start_at must be at least 1900-01-01 00:00 UTC."),
    ],
)
def test_a_value_out_of_range_is_refused_with_its_range(name, value, message):
    assert bounds.SCHEDULE[name].error(name, value) == message


def test_validating_a_schedule_costs_no_query_per_check_constraint(db):
    schedule = Schedule(**fields_with("misfire_grace", timedelta(hours=1)))
    with CaptureQueriesContext(connection) as queries:
        schedule.full_clean()
    assert len(queries) == 1, queries.captured_queries  # the unique name, no CHECK repeated


# -- the database ----------------------------------------------------------------------------


def raw_update(schedule: Schedule, name: str, value) -> None:
    field = Schedule._meta.get_field(name)
    table, column = Schedule._meta.db_table, connection.ops.quote_name(field.column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {column} = %s WHERE id = %s",
            [field.get_db_prep_save(value, connection), schedule.pk],
        )


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), OUTSIDE)
def test_the_database_refuses_each_value_out_of_range(name, value):
    schedule = saved_for(name)
    # The error names the constraint: its own, or for a negative count on SQLite the
    # column's (PositiveIntegerField's check).
    with pytest.raises(IntegrityError, match=name), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(**{name: value})
    with pytest.raises(IntegrityError, match=name), transaction.atomic():
        raw_update(schedule, name, value)
    stored = Schedule.objects.filter(pk=schedule.pk).values_list(name, flat=True).get()
    assert stored == getattr(schedule, name)


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), cases(ends))
def test_the_database_accepts_the_ends_of_each_range(name, value):
    schedule = saved_for(name)
    Schedule.objects.filter(pk=schedule.pk).update(**{name: value})
    assert Schedule.objects.filter(pk=schedule.pk).values_list(name, flat=True).get() == value


@pytest.mark.django_db
def test_empty_optional_fields_pass_their_checks():
    schedule = ScheduleFactory(timeout=None, max_concurrent=None, keep_runs=None)
    Schedule.objects.filter(pk=schedule.pk).update(start_at=None, end_at=None, keep_runs_for=None)
    assert Schedule.objects.filter(timeout=None, keep_runs=None, end_at=None).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12"])  # UTC+14, UTC-12
def test_the_admin_lists_schedules_at_the_ends_of_the_ranges(admin_client, settings, zone):
    settings.TIME_ZONE = zone
    ScheduleFactory(name="last", interval=None, run_at=LATEST - US, misfire_grace=CENTURY)
    ScheduleFactory(name="first", interval=None, run_at=EARLIEST, keep_runs_for=CENTURY)
    ScheduleFactory(name="long", interval=CENTURY, start_at=LATEST - US, end_at=LATEST - US)
    response = admin_client.get(reverse("admin:django_periodic_schedule_changelist"))
    assert response.status_code == 200
    assert {"last", "first", "long"} <= set(re.findall(r">(last|first|long)<", response.text))


# -- MIN_INTERVAL: below it, a stored interval gives no trigger -----------------------------


def test_clean_refuses_an_interval_below_the_min_interval_setting(settings):
    every = timedelta(milliseconds=500)
    expected = "The interval (500 ms) must be at least MIN_INTERVAL (1 s)."
    with pytest.raises(ValidationError) as raised:
        Schedule(**fields_with("interval", every)).clean()
    assert raised.value.message_dict == {"interval": [expected]}
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": 0.1}
    Schedule(**fields_with("interval", every)).clean()


def test_a_row_below_the_min_interval_gets_no_trigger(settings):
    fast = timedelta(milliseconds=10)
    expected = "The interval (10 ms) must be at least MIN_INTERVAL (1 s)."
    with pytest.raises(triggers.InvalidTrigger) as from_schedule:
        Schedule(interval=fast, created_at=T0).trigger  # noqa: B018 (building it refuses it)
    with pytest.raises(triggers.InvalidTrigger) as from_due_row:
        due_row(T0, interval=fast).trigger()
    assert str(from_schedule.value) == str(from_due_row.value) == expected
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": fast}
    assert due_row(T0, interval=fast).trigger().next_after(T0) == T0 + fast


@pytest.mark.django_db
def test_a_stored_interval_below_the_minimum_fails_planning_until_disabled(settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 3}
    fast = ScheduleFactory(start_at=T0)
    good = ScheduleFactory(start_at=T0, interval=timedelta(seconds=1))
    Schedule.objects.filter(pk=fast.pk).update(interval=timedelta(milliseconds=10))
    Schedule.objects.update(next_fire_at=T0)
    for tick in range(1, 4):
        planner.plan_due(T0 + timedelta(seconds=tick))
    fast.refresh_from_db()
    assert (fast.enabled, fast.planning_failures, fast.runs.count()) == (False, 3, 0)
    assert "must be at least MIN_INTERVAL (1 s)" in fast.last_error
    assert good.runs.count() == 4


# -- rows stored without save() get the UNPLANNED cursor ------------------------------------


@pytest.mark.django_db
def test_bulk_create_stores_the_unplanned_cursor_and_an_explicit_null_stays():
    Schedule.objects.bulk_create(
        [
            Schedule(name="bulk", job="tests.jobs.noop", interval=timedelta(minutes=1)),
            Schedule(name="none", job="tests.jobs.noop", cron="0 3 * * *", next_fire_at=None),
        ]
    )
    stored = dict(Schedule.objects.values_list("name", "next_fire_at"))
    assert stored == {"bulk": UNPLANNED, "none": None}
    assert Schedule.objects.get(name="bulk").is_unplanned
    assert not Schedule.objects.get(name="none").is_unplanned


@pytest.mark.django_db
def test_save_and_create_still_compute_the_cursor():
    now = clock.now()
    created = Schedule.objects.create(name="c", job="tests.jobs.noop", cron="0 3 * * *")
    saved = Schedule(name="s", job="tests.jobs.noop", interval=timedelta(minutes=1))
    saved.save()
    for schedule in (created, saved):
        schedule.refresh_from_db()
        assert now < schedule.next_fire_at < now + timedelta(days=1)
        assert not schedule.is_unplanned


@pytest.mark.django_db
def test_an_insert_in_raw_sql_without_the_cursor_gets_the_unplanned_cursor():
    model = Schedule(name="raw", job="tests.jobs.noop", interval=timedelta(minutes=1))
    model.updated_at = model.created_at  # auto_now: set by save() only
    fields = [f for f in Schedule._meta.concrete_fields if f.name not in ("id", "next_fire_at")]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    values = [f.get_db_prep_save(getattr(model, f.attname), connection) for f in fields]
    placeholders = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Schedule._meta.db_table} ({columns}) VALUES ({placeholders})", values
        )
    assert Schedule.objects.get(name="raw").is_unplanned


@pytest.mark.django_db
def test_a_fixture_without_the_cursor_loads_unplanned(tmp_path):
    fixture = tmp_path / "schedules.json"
    fields = {"name": "fixture", "job": "tests.jobs.noop", "cron": "0 3 * * *"}
    fields.update(created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z")
    fixture.write_text(json.dumps([{"model": "django_periodic.schedule", "fields": fields}]))
    call_command("loaddata", str(fixture), verbosity=0)
    assert Schedule.objects.get(name="fixture").is_unplanned


# -- the migration: old rows out of range ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_old_values_into_range_and_disables_their_schedules():
    before = ("django_periodic", "0008_backfill_in_ledger")
    call_command("migrate", *before, verbosity=0)
    try:
        old = MigrationExecutor(connection).loader.project_state(before).apps
        Old = old.get_model("django_periodic", "Schedule")
        values = {"job": "tests.jobs.noop", "interval": timedelta(minutes=1)}
        Old.objects.create(name="fine", **values)
        Old.objects.create(name="never-skip", **values, misfire_grace=timedelta(days=999_999))
        Old.objects.create(name="fast", job="tests.jobs.noop", interval=US, max_attempts=0)
        Old.objects.create(name="no-lease", **values, lease_timeout=timedelta(0))
    finally:
        call_command("migrate", "django_periodic", verbosity=0)
    rows = {s.name: s for s in Schedule.objects.all()}
    assert (rows["fine"].enabled, rows["fine"].last_error) == (True, "")
    assert rows["never-skip"].misfire_grace == CENTURY
    assert (rows["fast"].interval, rows["fast"].max_attempts) == (bounds.INTERVAL_FLOOR, 1)
    assert rows["no-lease"].lease_timeout == timedelta(seconds=30)  # the field's default
    for name in ("never-skip", "fast", "no-lease"):
        assert not rows[name].enabled
        assert rows[name].last_error.startswith("Disabled by migration 0009: ")
    assert "misfire_grace must be at most 36525 days" in rows["never-skip"].last_error
    assert "max_attempts must be at least 1" in rows["fast"].last_error


# -- the docs --------------------------------------------------------------------------------


def test_the_docs_list_every_range_as_bounds_holds_it():
    text = DOCS.read_text()
    section = text.split("\n## Ranges\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    listed = {name: cell.strip() for name, cell in rows}
    assert listed == {name: valid.describe() for name, valid in bounds.SCHEDULE.items()}
