"""import_celery_beat: django-celery-beat's periodic tasks, as real rows of its own models or
a dumpdata file of them, become schedules; what cannot be mapped is reported, never dropped;
malformed data is an error that names the entry and the field, with nothing saved."""

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django_celery_beat import models as beat

from django_periodic import registry
from django_periodic.db import clock
from django_periodic.engine.planning.code_schedules import code_defined_values
from django_periodic.models import Schedule
from django_periodic.operations.celerybeat.emitting import EMITTED_FIELDS
from django_periodic.timing import triggers
from tests.factories import ScheduleFactory

# Schedule fields the import sets (the cursor and anchor depend on when it runs).
MAPPED_FIELDS = (
    "name",
    "job",
    "args",
    "kwargs",
    "cron",
    "timezone",
    "interval",
    "run_at",
    "start_at",
    "end_at",
    "enabled",
    "misfire_grace",
)
# After the end of daylight saving time in Europe, a week with no clock change.
QUIET_WEEK = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def run_import(*args, **options) -> str:
    out = StringIO()
    call_command("import_celery_beat", *args, stdout=out, **options)
    return out.getvalue()


def periodic_task(name: str, task: str = "tests.jobs.noop", **fields) -> "beat.PeriodicTask":
    if not any(key in fields for key in ("crontab", "interval", "clocked", "solar")):
        fields["interval"] = beat.IntervalSchedule.objects.create(every=5, period="minutes")
    return beat.PeriodicTask.objects.create(name=name, task=task, **fields)


def crontab(**fields) -> "beat.CrontabSchedule":
    return beat.CrontabSchedule.objects.create(**fields)


def celery_fire_times(crontab_row, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` times celery's own crontab schedule (django-celery-beat's, tz-aware)
    fires after ``after``, each computed from the one before as beat does."""
    schedule, times = crontab_row.schedule, []
    for _ in range(n):
        start, remaining, _now = schedule.remaining_delta(after)
        after = start + remaining
        times.append(after.astimezone(UTC))
    return times


def mapped(schedule: Schedule) -> dict:
    return {name: getattr(schedule, name) for name in MAPPED_FIELDS}


@pytest.fixture
def celery_rows(db):
    """One periodic task of each kind and quirk, as a project on django-celery-beat has them."""
    berlin = crontab(minute="30", hour="2", day_of_week="mon-fri", timezone="Europe/Berlin")
    periodic_task("cron", crontab=berlin, args="[1]", kwargs='{"a": 2}')
    periodic_task(
        "interval", interval=beat.IntervalSchedule.objects.create(every=90, period="seconds")
    )
    clocked = beat.ClockedSchedule.objects.create(clocked_time=datetime(2030, 1, 1, 9, tzinfo=UTC))
    periodic_task("clocked", clocked=clocked, one_off=True)
    sunrise = beat.SolarSchedule.objects.create(event="sunrise", latitude=52.5, longitude=13.4)
    periodic_task("solar", solar=sunrise)
    periodic_task("paused", enabled=False)
    periodic_task("routed", queue="reports", routing_key="reports.high", priority=5)
    periodic_task(
        "bounded",
        start_time=datetime(2030, 1, 1, tzinfo=UTC),
        expires=datetime(2031, 1, 1, tzinfo=UTC),
        expire_seconds=None,
    )
    periodic_task("bad json", args="[1, ")
    periodic_task("unknown job", task="legacy.tasks.gone")


# -- what each kind becomes ---------------------------------------------------------------


def test_crontab_becomes_a_cron_in_its_timezone_firing_when_celery_does(db):
    row = crontab(minute="30", hour="2", day_of_week="mon-fri", timezone="Europe/Berlin")
    periodic_task("nightly", crontab=row, args="[1]", kwargs='{"a": 2}')

    run_import()

    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.trigger_kind, schedule.cron) == ("cron", "30 2 * * mon-fri")
    assert (schedule.timezone, schedule.args, schedule.kwargs) == ("Europe/Berlin", [1], {"a": 2})
    expected = celery_fire_times(row, QUIET_WEEK, 6)
    assert schedule.next_fire_times(6, after=QUIET_WEEK) == expected


@pytest.mark.parametrize(
    ("period", "every", "interval"),
    [
        ("days", 2, timedelta(days=2)),
        ("hours", 3, timedelta(hours=3)),
        ("minutes", 15, timedelta(minutes=15)),
        ("seconds", 90, timedelta(seconds=90)),
        ("microseconds", 1_500_000, timedelta(microseconds=1_500_000)),  # >= MIN_INTERVAL
    ],
)
def test_an_interval_becomes_the_same_timedelta_in_each_period(db, period, every, interval):
    periodic_task(
        "every", interval=beat.IntervalSchedule.objects.create(every=every, period=period)
    )

    run_import()

    schedule = Schedule.objects.get(name="every")
    assert (schedule.trigger_kind, schedule.interval) == ("interval", interval)


def test_an_interval_keeps_celerys_phase_from_its_last_run(db, now):
    last_run = now - timedelta(seconds=10)
    every = beat.IntervalSchedule.objects.create(every=1, period="minutes")
    periodic_task("phased", interval=every, last_run_at=last_run, total_run_count=3)

    output = run_import()

    # Beat fires it next at its last run + the interval.
    schedule = Schedule.objects.get(name="phased")
    assert schedule.next_fire_times(2, after=now) == [
        last_run + timedelta(minutes=1),
        last_run + timedelta(minutes=2),
    ]
    assert "History (3 runs" in output


def test_a_clocked_task_becomes_a_one_shot_at_its_time(db):
    clocked = beat.ClockedSchedule.objects.create(clocked_time=datetime(2030, 1, 1, 9, tzinfo=UTC))
    periodic_task("launch", clocked=clocked, one_off=True)

    run_import()

    schedule = Schedule.objects.get(name="launch")
    assert (schedule.trigger_kind, schedule.run_at) == ("once", clocked.clocked_time)
    assert schedule.next_fire_at == clocked.clocked_time


def test_a_one_off_crontab_becomes_a_one_shot_at_its_next_time(db, now):
    new_year = crontab(minute="0", hour="3", day_of_month="1", month_of_year="1", timezone="UTC")
    periodic_task("once a year, once", crontab=new_year, one_off=True)

    run_import()

    schedule = Schedule.objects.get(name="once a year, once")
    assert schedule.trigger_kind == "once"
    assert schedule.run_at == triggers.cron("0 3 1 1 *").next_after(now)


def test_a_one_off_interval_becomes_a_one_shot_one_interval_from_the_import(db):
    every = beat.IntervalSchedule.objects.create(every=2, period="hours")
    periodic_task("in two hours, once", interval=every, one_off=True)
    before = clock.now()

    run_import()

    schedule = Schedule.objects.get(name="in two hours, once")
    assert schedule.trigger_kind == "once"
    assert before + timedelta(hours=2) <= schedule.run_at <= clock.now() + timedelta(hours=2)


def test_a_one_off_task_that_has_run_is_imported_disabled(db):
    new_year = crontab(minute="0", hour="3", day_of_month="1", month_of_year="1", timezone="UTC")
    periodic_task("ran once", crontab=new_year, one_off=True, total_run_count=1)

    output = run_import()

    assert not Schedule.objects.get(name="ran once").enabled
    assert "it has run already" in output


def test_a_disabled_task_stays_disabled(db):
    periodic_task("paused", enabled=False)

    run_import()

    assert not Schedule.objects.get(name="paused").enabled


def test_paused_imports_every_schedule_disabled_beside_beat(celery_rows):
    run_import(paused=True)

    assert Schedule.objects.count() == 6
    assert not Schedule.objects.filter(enabled=True).exists()


def test_start_time_and_expires_become_the_bounds(db):
    start, expires = datetime(2030, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    periodic_task("bounded", start_time=start, expires=expires)

    run_import()

    schedule = Schedule.objects.get(name="bounded")
    assert (schedule.start_at, schedule.end_at) == (start, expires)
    assert schedule.next_fire_at == start


def test_expire_seconds_becomes_the_misfire_grace(db):
    periodic_task("short-lived", expire_seconds=300)

    output = run_import()

    assert Schedule.objects.get(name="short-lived").misfire_grace == timedelta(seconds=300)
    assert "expire_seconds 300 became misfire_grace" in output


def test_a_task_name_runs_the_job_its_job_map_names(db):
    periodic_task("mapped", task="legacy.tasks.add", kwargs='{"a": 1, "b": 2}')

    run_import(job_map=["legacy.tasks.add=tests.jobs.add"])

    assert Schedule.objects.get(name="mapped").job == "tests.jobs.add"


# -- what is reported rather than imported ------------------------------------------------


def test_a_solar_task_is_listed_with_the_reason_and_not_imported(db):
    sunrise = beat.SolarSchedule.objects.create(event="sunrise", latitude=52.5, longitude=13.4)
    periodic_task("at dawn", solar=sunrise)

    output = run_import()

    assert not Schedule.objects.filter(name="at dawn").exists()
    assert "not imported     'at dawn'" in output
    assert "Solar schedules (sunrise at 52.500000, 13.400000) have no equivalent" in output


def test_queue_routing_is_listed_as_not_carried_over(db):
    periodic_task("routed", queue="reports", routing_key="reports.high", priority=5)

    output = run_import()

    assert Schedule.objects.filter(name="routed").exists()
    assert "queue 'reports', routing_key 'reports.high', priority 5" in output


def test_arguments_that_are_not_json_are_reported(db):
    periodic_task("bad json", args="[1, ")

    output = run_import()

    assert not Schedule.objects.filter(name="bad json").exists()
    assert "args is not valid JSON" in output


def test_a_task_with_no_registered_job_is_reported_with_the_job_map_hint(db):
    periodic_task("unknown job", task="legacy.tasks.gone")

    output = run_import()

    assert not Schedule.objects.filter(name="unknown job").exists()
    assert "No job named 'legacy.tasks.gone' is registered" in output
    assert "--job-map legacy.tasks.gone=<job>" in output


def test_arguments_the_job_cannot_take_are_reported(db):
    periodic_task("misfit", task="tests.jobs.add", args="[1, 2, 3]")

    output = run_import()

    assert not Schedule.objects.filter(name="misfit").exists()
    assert "The arguments do not fit tests.jobs.add()" in output


def test_a_crontab_restricting_both_day_fields_is_reported(db):
    first_monday = crontab(minute="0", hour="9", day_of_month="1-7", day_of_week="1")
    periodic_task("first monday", crontab=first_monday)

    output = run_import()

    assert not Schedule.objects.filter(name="first monday").exists()
    assert "matching both day_of_month and day_of_week" in output


def test_a_range_celery_wraps_is_imported_as_the_hours_celery_fires_at(db):
    overnight = crontab(minute="0", hour="22-2")  # celery wraps the range; cron does not
    periodic_task("overnight", crontab=overnight)

    run_import()

    assert Schedule.objects.get(name="overnight").cron == "0 0-2,22,23 * * *"


@pytest.mark.parametrize(
    "field, text",
    [
        ("hour", "22-2"),
        ("hour", "22-2/2"),
        ("hour", "1,20-3"),
        ("minute", "50-10/5"),
        ("day_of_month", "28-3"),
        ("month_of_year", "11-2"),
        ("day_of_week", "fri-mon"),
        ("day_of_week", "sat-sun"),
    ],
)
def test_a_wrapping_field_reads_as_celerys_own_parser_reads_it(field, text):
    from celery.schedules import crontab as celery_crontab

    from django_periodic.operations.celerybeat.crontabs import celery_field_values
    from django_periodic.operations.celerybeat.rows import CRON_FIELDS

    expected = frozenset(getattr(celery_crontab(**{field: text}), field))
    assert celery_field_values(text, CRON_FIELDS.index(field)) == expected


def test_a_crontab_neither_celery_nor_cron_reads_is_reported_with_the_field(db):
    periodic_task("odd", crontab=crontab(minute="0", hour="9-x"))

    output = run_import()

    assert not Schedule.objects.filter(name="odd").exists()
    assert "Invalid hour field '9-x'" in output


def test_emitted_code_defines_the_enabled_tasks_the_import_creates(
    celery_rows, tmp_path, clean_registry
):
    from tests.test_import_celery_beat_app import emitted_module

    output = run_import(emit_code=True)
    assert not Schedule.objects.exists()  # nothing is written
    emitted_module(tmp_path, output, "emitted_tables")
    assert "#   periodic task 'paused' (tests.jobs.noop): it is disabled" in output

    run_import()
    defined = [s for s in Schedule.objects.all() if s.name in registry.registered_jobs()]
    assert sorted(s.name for s in defined) == ["bounded", "clocked", "cron", "interval", "routed"]
    for imported in defined:
        values = code_defined_values(registry.get_job(imported.name))
        assert {k: values[k] for k in EMITTED_FIELDS} == {
            k: getattr(imported, k) for k in EMITTED_FIELDS
        }, imported.name


# -- dry run, re-import, and the dump ------------------------------------------------------


def test_a_dry_run_prints_the_mapping_and_saves_nothing(celery_rows):
    output = run_import(dry_run=True)

    assert not Schedule.objects.exists()
    assert "would create     'cron' (tests.jobs.noop) -> cron 30 2 * * mon-fri" in output
    assert "would not import 'solar'" in output
    assert "Dry run, nothing saved: 6 would create, 0 would update, 0 would skip, " in output


def test_importing_twice_creates_nothing_the_second_time(celery_rows):
    run_import()
    before = sorted(Schedule.objects.values_list("name", "updated_at"))

    output = run_import()

    assert sorted(Schedule.objects.values_list("name", "updated_at")) == before
    assert "0 created, 0 updated, 6 skipped, 3 not imported." in output


def test_update_overwrites_a_schedule_of_the_same_name(db):
    ScheduleFactory(name="nightly", interval=timedelta(hours=1))
    row = crontab(minute="0", hour="3", timezone="Europe/Paris")
    periodic_task("nightly", crontab=row)

    run_import(update=True)

    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.cron, schedule.timezone, schedule.interval) == (
        "0 3 * * *",
        "Europe/Paris",
        None,
    )


def test_a_schedule_defined_in_code_is_never_overwritten(db):
    ScheduleFactory(name="nightly", defined_in="tests.jobs:1")
    periodic_task("nightly", crontab=crontab(minute="0", hour="3"))

    output = run_import(update=True)

    assert Schedule.objects.get(name="nightly").cron == ""
    assert "defined in code (tests.jobs:1)" in output


def test_a_dump_maps_as_the_database_does(celery_rows, tmp_path):
    dump = tmp_path / "beat.json"
    call_command("dumpdata", "django_celery_beat", output=str(dump), verbosity=0)
    from_database = run_import()
    imported = {s.name: mapped(s) for s in Schedule.objects.all()}
    # A clean state: neither the schedules nor django-celery-beat's rows.
    Schedule.objects.all().delete()
    beat.PeriodicTask.objects.all().delete()

    from_dump = run_import(from_json=str(dump))

    assert {s.name: mapped(s) for s in Schedule.objects.all()} == imported
    assert from_dump == from_database


def test_a_dump_is_read_without_the_app(db, tmp_path):
    dump = tmp_path / "beat.json"
    fields = {"name": "hourly", "task": "tests.jobs.noop", "crontab": 1, "args": "[]"}
    records = [
        {"model": "django_celery_beat.periodictask", "pk": 1, "fields": fields},
        {
            "model": "django_celery_beat.crontabschedule",
            "pk": 1,
            "fields": {"minute": "0", "hour": "*", "timezone": "Asia/Tokyo"},
        },
        {"model": "auth.user", "pk": 1, "fields": {"username": "ignored"}},
    ]
    dump.write_text(json.dumps(records))

    output = run_import(from_json=str(dump))

    schedule = Schedule.objects.get(name="hourly")
    assert (schedule.cron, schedule.timezone) == ("0 * * * *", "Asia/Tokyo")
    assert "1 created, 0 updated, 0 skipped, 0 not imported." in output


def test_a_missing_dump_is_a_command_error(db, tmp_path):
    with pytest.raises(CommandError, match="No such file"):
        run_import(from_json=str(tmp_path / "absent.json"))


def test_a_file_that_is_not_a_fixture_is_a_command_error(db, tmp_path):
    dump = tmp_path / "beat.json"
    dump.write_text('{"not": "a list"}')

    with pytest.raises(CommandError, match="JSON list of records"):
        run_import(from_json=str(dump))


def test_a_job_map_without_an_equals_sign_is_a_command_error(db):
    with pytest.raises(CommandError, match="CELERY_TASK=JOB"):
        run_import(job_map=["legacy.tasks.add"])


WITHOUT_THE_APP = """
import sys
import django
from django.conf import settings
from django.core.management import CommandError, call_command

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_periodic"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
    USE_TZ=True,
)
django.setup()
call_command("migrate", verbosity=0)
try:
    call_command("import_celery_beat")
except CommandError as exc:
    print("error:", exc)
call_command("import_celery_beat", from_json=sys.argv[2], dry_run=True)
print("imported django_celery_beat:", "django_celery_beat" in sys.modules)
"""


def test_the_command_works_without_django_celery_beat_in_installed_apps(tmp_path):
    dump = tmp_path / "beat.json"
    dump.write_text("[]")

    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_APP, str(tmp_path / "db.sqlite3"), str(dump)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    assert "error: django_celery_beat is not in INSTALLED_APPS" in result.stdout
    assert "Dry run, nothing saved: 0 would create" in result.stdout
    assert "imported django_celery_beat: False" in result.stdout


# -- malformed data: a CommandError naming the entry and the field, and nothing saved -------

# A dump with a good task before the bad one (tasks are imported by name), and one after.
GOOD_DUMP = [
    {
        "model": "django_celery_beat.intervalschedule",
        "pk": 1,
        "fields": {"every": 5, "period": "minutes"},
    },
    {
        "model": "django_celery_beat.intervalschedule",
        "pk": 2,
        "fields": {"every": 1, "period": "hours"},
    },
    {
        "model": "django_celery_beat.crontabschedule",
        "pk": 1,
        "fields": {
            "minute": "0",
            "hour": "3",
            "day_of_month": "*",
            "month_of_year": "*",
            "day_of_week": "*",
            "timezone": "UTC",
        },
    },
    {
        "model": "django_celery_beat.clockedschedule",
        "pk": 1,
        "fields": {"clocked_time": "2030-01-01T09:00:00Z"},
    },
    {
        "model": "django_celery_beat.solarschedule",
        "pk": 1,
        "fields": {"event": "sunrise", "latitude": "52.500000", "longitude": "13.400000"},
    },
    {
        "model": "django_celery_beat.periodictask",
        "pk": 1,
        "fields": {"name": "a good one", "task": "tests.jobs.noop", "interval": 1},
    },
    {
        "model": "django_celery_beat.periodictask",
        "pk": 2,
        "fields": {"name": "bad", "task": "tests.jobs.noop", "interval": 2},
    },
    {
        "model": "django_celery_beat.periodictask",
        "pk": 3,
        "fields": {"name": "good too", "task": "tests.jobs.noop", "crontab": 1},
    },
]
BAD_TASK = 7  # the record of the task named "bad" (records count from 1)
MISSING = object()  # a field the record lacks


def damaged(path: tuple, value) -> list:
    """GOOD_DUMP with the value at ``path`` (a record's number, then keys) replaced."""
    records = copy.deepcopy(GOOD_DUMP)
    number, *keys = path
    if not keys:
        records[number - 1] = value
        return records
    target = records[number - 1]
    for key in keys[:-1]:
        target = target[key]
    if value is MISSING:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return records


def task(key: str) -> tuple:
    return (BAD_TASK, "fields", key)


TASK = "Periodic task 'bad', field"
MALFORMED = [
    # The file's shape.
    (
        (BAD_TASK,),
        ["not", "a", "record"],
        "Record 7: expected a record (model, pk, fields), found a list.",
    ),
    ((BAD_TASK, "model"), 5, "Record 7, field 'model': expected text, found 5."),
    ((BAD_TASK, "pk"), [2], "Record 7, field 'pk': expected a primary key, found a list."),
    ((BAD_TASK, "fields"), [], "Record 7, field 'fields': expected an object, found a list."),
    (task("name"), 5, "Record 7, field 'name': expected text, found 5."),
    (task("name"), MISSING, "Record 7, field 'name': missing."),
    (
        task("name"),
        "a good one",
        "Periodic task 'a good one', field 'name': two periodic tasks have this name.",
    ),
    ((2, "pk"), 1, "Interval schedule pk 1, field 'pk': two interval schedules have this pk."),
    # Each field of a periodic task the import reads.
    (task("task"), ["x"], f"{TASK} 'task': expected text, found a list."),
    (task("interval"), [2], f"{TASK} 'interval': expected a primary key, found a list."),
    (task("crontab"), {"pk": 1}, f"{TASK} 'crontab': expected a primary key, found an object."),
    (task("clocked"), True, f"{TASK} 'clocked': expected a primary key, found true."),
    (task("solar"), 1.5, f"{TASK} 'solar': expected a primary key, found 1.5."),
    (task("args"), [1], f"{TASK} 'args': expected text, found a list."),
    (task("kwargs"), {"a": 1}, f"{TASK} 'kwargs': expected text, found an object."),
    # Arguments Python's json reads but no schedule can hold (the checks of Schedule.clean()).
    (task("args"), "[NaN]", f"{TASK} 'args': args cannot hold NaN: JSON has no NaN or infinity."),
    (
        task("args"),
        "[1e400]",
        f"{TASK} 'args': args cannot hold Infinity: JSON has no NaN or infinity.",
    ),
    (
        task("kwargs"),
        '{"a": [-1e400]}',
        f"{TASK} 'kwargs': kwargs cannot hold -Infinity: JSON has no NaN or infinity.",
    ),
    (
        task("args"),
        "[" * 500 + "]" * 500,
        f"{TASK} 'args': args cannot nest lists and objects more than 32 levels deep.",
    ),
    (task("enabled"), "false", f"{TASK} 'enabled': expected true or false, found 'false'."),
    (task("enabled"), 0, f"{TASK} 'enabled': expected true or false, found 0."),
    (task("enabled"), None, f"{TASK} 'enabled': expected true or false, found null."),
    (task("one_off"), "yes", f"{TASK} 'one_off': expected true or false, found 'yes'."),
    (
        task("start_time"),
        "2020-02-30",
        f"{TASK} 'start_time': expected a date and time, found '2020-02-30'.",
    ),
    (
        task("expires"),
        "2020-02-30T10:00:00",
        f"{TASK} 'expires': '2020-02-30T10:00:00' is not a date and time (day is out of range "
        "for month).",
    ),
    (task("expires"), 1700000000, f"{TASK} 'expires': expected a date and time, found 1700000000."),
    (
        task("start_time"),
        "9999-12-31T00:00:00Z",
        f"{TASK} 'start_time': '9999-12-31T00:00:00Z' is out of range: from 1900-01-01 to "
        "before 9000-01-01.",
    ),
    (
        task("last_run_at"),
        "yesterday",
        f"{TASK} 'last_run_at': expected a date and time, found 'yesterday'.",
    ),
    (task("expire_seconds"), "x", f"{TASK} 'expire_seconds': expected a whole number, found 'x'."),
    (task("expire_seconds"), 1.5, f"{TASK} 'expire_seconds': expected a whole number, found 1.5."),
    (
        task("expire_seconds"),
        -1,
        f"{TASK} 'expire_seconds': expected a number of at least 0, found -1.",
    ),
    (task("expire_seconds"), 10**20, f"{TASK} 'expire_seconds': {10**20} seconds is out of range."),
    (
        task("total_run_count"),
        "3",
        f"{TASK} 'total_run_count': expected a whole number, found '3'.",
    ),
    (task("queue"), 7, f"{TASK} 'queue': expected text, found 7."),
    (task("exchange"), [], f"{TASK} 'exchange': expected text, found a list."),
    (task("routing_key"), {}, f"{TASK} 'routing_key': expected text, found an object."),
    (task("priority"), "high", f"{TASK} 'priority': expected a whole number, found 'high'."),
    (task("headers"), None, f"{TASK} 'headers': expected text, found null."),
    (task("description"), 5, f"{TASK} 'description': expected text, found 5."),
    # Each field of a schedule row.
    (
        (2, "fields", "every"),
        "5",
        "Interval schedule pk 2, field 'every': expected a whole number, found '5'.",
    ),
    (
        (2, "fields", "every"),
        0,
        "Interval schedule pk 2, field 'every': expected a number of at least 1, found 0.",
    ),
    ((2, "fields", "every"), MISSING, "Interval schedule pk 2, field 'every': missing."),
    (
        (2, "fields", "every"),
        10**12,
        f"Interval schedule pk 2 of periodic task 'bad', field 'every': {10**12} hours is out "
        "of range.",
    ),
    (
        (2, "fields", "period"),
        "fortnights",
        "Interval schedule pk 2, field 'period': expected one of days, hours, minutes, seconds, "
        "microseconds, found 'fortnights'.",
    ),
    ((3, "fields", "minute"), 5, "Crontab schedule pk 1, field 'minute': expected text, found 5."),
    (
        (3, "fields", "minute"),
        "1" * 5000,
        "Crontab schedule pk 1, field 'minute': expected at most 240 characters, found 5000.",
    ),
    (
        (3, "fields", "timezone"),
        "Mars/Olympus",
        "Crontab schedule pk 1, field 'timezone': Unknown time zone 'Mars/Olympus'.",
    ),
    (
        (4, "fields", "clocked_time"),
        "2020-02-30",
        "Clocked schedule pk 1, field 'clocked_time': expected a date and time, found "
        "'2020-02-30'.",
    ),
    (
        (4, "fields", "clocked_time"),
        MISSING,
        "Clocked schedule pk 1, field 'clocked_time': missing.",
    ),
    (
        (5, "fields", "latitude"),
        [52],
        "Solar schedule pk 1, field 'latitude': expected a number, found a list.",
    ),
    # Values no schedule can hold (Schedule.full_clean()), found after "a good one" is saved.
    (
        task("name"),
        "x" * 201,
        f"Periodic task '{'x' * 201}', field 'name': Ensure this value has at most 200 "
        "characters (it has 201).",
    ),
    (
        (BAD_TASK, "fields"),
        {
            "name": "bad",
            "interval": 2,
            "start_time": "2031-01-01T00:00:00Z",
            "expires": "2030-01-01T00:00:00Z",
        },
        f"{TASK} 'end_at': end_at must be after start_at.",
    ),
]


def case_id(path: tuple, value) -> str:
    where = ".".join(map(str, path))
    return f"{where} missing" if value is MISSING else f"{where}={value!r:.20}"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    MALFORMED,
    ids=[case_id(path, value) for path, value, _ in MALFORMED],
)
def test_malformed_data_is_a_command_error_naming_the_entry_and_field(
    db, tmp_path, path, value, message
):
    dump = tmp_path / "beat.json"
    dump.write_text(json.dumps(damaged(path, value)))

    with pytest.raises(CommandError) as raised:
        run_import(from_json=str(dump))

    assert str(raised.value) == f"{message} Nothing was imported."
    assert not Schedule.objects.exists()


def write_dump(tmp_path, records) -> str:
    dump = tmp_path / "beat.json"
    dump.write_text(json.dumps(records))
    return str(dump)


def test_the_undamaged_dump_imports_every_task(db, tmp_path):
    run_import(from_json=write_dump(tmp_path, GOOD_DUMP))

    names = sorted(Schedule.objects.values_list("name", flat=True))
    assert names == ["a good one", "bad", "good too"]


def test_a_malformed_task_undoes_the_updates_before_it(db, tmp_path):
    before = ScheduleFactory(name="a good one", interval=timedelta(hours=1))
    records = damaged(task("name"), "x" * 201)  # fails after "a good one" was updated

    with pytest.raises(CommandError, match="field 'name'"):
        run_import(from_json=write_dump(tmp_path, records), update=True)

    after = Schedule.objects.get()
    assert (after.name, after.interval, after.updated_at) == (
        "a good one",
        timedelta(hours=1),
        before.updated_at,
    )


INTERVAL = (2, "fields")  # the interval schedule of the task named "bad"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (INTERVAL, {"every": 40_000, "period": "days"}, "interval"),  # over a century
        (INTERVAL, {"every": 500_000, "period": "microseconds"}, "interval"),  # < MIN_INTERVAL
        (task("expire_seconds"), 4_000_000_000, "misfire_grace"),  # over a century
    ],
    ids=["interval above", "interval below", "misfire_grace above"],
)
def test_a_value_out_of_a_schedules_range_is_a_command_error(db, tmp_path, path, value, field):
    records = damaged(path, value)

    with pytest.raises(CommandError) as raised:
        run_import(from_json=write_dump(tmp_path, records))

    # The range, and its words, are the model's (Schedule.clean()).
    message = str(raised.value)
    assert message.startswith(f"Periodic task 'bad', field '{field}': ")
    assert message.endswith(" Nothing was imported.")
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # Deeper than Python's recursion limit: json.loads raises RecursionError.
        (b"[" * 100_000 + b"]" * 100_000, "it is nested deeper than any dumpdata file."),
        (b'[{"model": ', "Expecting value: line 1 column 12 (char 11)"),
        (b"[\xff]", "'utf-8' codec can't decode byte 0xff in position 1: invalid start byte"),
    ],
    ids=["nested", "truncated", "not utf-8"],
)
def test_a_file_that_cannot_be_read_as_json_is_a_command_error(db, tmp_path, content, message):
    dump = tmp_path / "beat.json"
    dump.write_bytes(content)

    with pytest.raises(CommandError) as raised:
        run_import(from_json=str(dump))

    assert str(raised.value) == f"Cannot read {dump}: {message}"


def test_arguments_nested_too_deeply_are_reported(db, tmp_path):
    records = damaged(task("args"), "[" * 100_000 + "]" * 100_000)

    output = run_import(from_json=write_dump(tmp_path, records))

    assert "args is not valid JSON (maximum recursion depth exceeded" in output
    assert sorted(Schedule.objects.values_list("name", flat=True)) == ["a good one", "good too"]


# Values stored in django-celery-beat's tables around its models (raw SQL):
# (the database they can be stored in, or None for both; table, column, value, message).
ODD_ROWS = [
    (
        None,
        "crontabschedule",
        "timezone",
        "Mars/Olympus",
        "Crontab schedule pk {crontab}, field 'timezone': its own model cannot read it "
        "(Invalid timezone 'Mars/Olympus').",
    ),
    (
        None,
        "intervalschedule",
        "every",
        0,
        "Interval schedule pk {interval}, field 'every': expected a number of at least 1, found 0.",
    ),
    (
        None,
        "intervalschedule",
        "period",
        "fortnights",
        "Interval schedule pk {interval}, field 'period': expected one of days, hours, minutes, "
        "seconds, microseconds, found 'fortnights'.",
    ),
    (
        "postgresql",
        "periodictask",
        "expires",
        "infinity",
        "Periodic task pk {task}, field 'expires': its own model cannot read it (timestamp too "
        "large (after year 10K): 'infinity').",
    ),
    (
        "sqlite",
        "intervalschedule",
        "every",
        "five",
        "Interval schedule pk {interval}, field 'every': expected a whole number, found 'five'.",
    ),
    (
        "sqlite",
        "periodictask",
        "start_time",
        "2020-02-30 10:00:00",
        "Periodic task pk {task}, field 'start_time': its own model cannot read it (day is out "
        "of range for month).",
    ),
]


@pytest.mark.parametrize(
    ("vendor", "table", "column", "value", "message"),
    ODD_ROWS,
    ids=[f"{table}.{column}={value}" for _, table, column, value, _ in ODD_ROWS],
)
def test_odd_rows_in_django_celery_beats_tables_are_a_command_error(
    db, vendor, table, column, value, message
):
    if vendor not in (None, connection.vendor):
        pytest.skip(f"{vendor} only: the other database refuses the value")
    every, cron = (
        beat.IntervalSchedule.objects.create(every=5, period="minutes"),
        crontab(minute="0", hour="3"),
    )
    periodic_task("fine", interval=every)
    odd = periodic_task("odd", crontab=cron)
    row = {"crontabschedule": cron, "intervalschedule": every, "periodictask": odd}[table]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_celery_beat_{table} SET {column} = %s WHERE id = %s", [value, row.pk]
        )

    with pytest.raises(CommandError) as raised:
        run_import()

    pks = {"crontab": cron.pk, "interval": every.pk, "task": odd.pk}
    assert str(raised.value) == f"{message.format(**pks)} Nothing was imported."
    assert not Schedule.objects.exists()


# -- what is printed: names and values from the data, escaped -----------------------------


def test_names_are_printed_with_their_control_characters_escaped(db):
    periodic_task("red\x1b[31m\n\u202eevil", task="legacy\x1b[2J.gone")

    output = run_import()

    assert "'red\\x1b[31m\\n\\u202eevil' (legacy\\x1b[2J.gone) -> every 0:05:00" in output
    assert "--job-map legacy\\x1b[2J.gone=<job>" in output
    assert not {"\x1b", "\u202e"} & set(output)


def test_a_command_errors_text_is_escaped_too(db, tmp_path):
    with pytest.raises(CommandError) as raised:
        run_import(from_json=str(tmp_path / "absent\x1b[2J.json"))

    assert "absent\\x1b[2J.json: [Errno 2] No such file" in str(raised.value)
    assert "\x1b" not in str(raised.value)
