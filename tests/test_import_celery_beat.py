"""import_celery_beat: django-celery-beat's periodic tasks, as real rows of its own models or
a dumpdata file of them, become schedules; what cannot be mapped is reported, never dropped."""

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_periodic import clock, triggers
from django_periodic.models import Schedule
from tests.factories import ScheduleFactory

beat = pytest.importorskip("django_celery_beat.models")

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
    assert before + timedelta(hours=2) < schedule.run_at <= clock.now() + timedelta(hours=2)


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


def test_a_crontab_cron_cannot_read_is_reported_with_the_field(db):
    overnight = crontab(minute="0", hour="22-2")  # celery wraps the range; cron does not
    periodic_task("overnight", crontab=overnight)

    output = run_import()

    assert not Schedule.objects.filter(name="overnight").exists()
    assert "Invalid hour field '22-2': range 22-2 is reversed" in output


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
