"""import_celery_beat --from-settings: a CELERY_BEAT_SCHEDULE written in code, the way
projects write it (floats of seconds, timedeltas, crontabs of every field form), becomes
schedules that fire when celery's own crontab says; what cannot be mapped is reported;
malformed entries are an error naming the entry and the key, with nothing saved."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar
from django.core.management import CommandError, call_command

from django_periodic.models import Schedule

# A week after the end of daylight saving time in Europe and the United States.
QUIET_WEEK = datetime(2026, 11, 9, 12, 0, tzinfo=UTC)


def run_import(*args, **options) -> str:
    out = StringIO()
    call_command("import_celery_beat", "--from-settings", *args, stdout=out, **options)
    return out.getvalue()


def celery_fire_times(cron, zone: str, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` times celery's own crontab fires after ``after``, in the time zone of
    an app configured with ``zone``, each computed from the one before as beat does."""
    app = Celery(set_as_current=False)
    app.conf.timezone = zone
    cron.app = app
    times = []
    for _ in range(n):
        start, remaining, _now = cron.remaining_delta(after)
        after = start + remaining
        times.append(after.astimezone(UTC))
    return times


def beat(settings, zone: str | None = None, **entries) -> None:
    """Set CELERY_BEAT_SCHEDULE to ``entries`` (and CELERY_TIMEZONE to ``zone``)."""
    settings.CELERY_BEAT_SCHEDULE = entries
    if zone is not None:
        settings.CELERY_TIMEZONE = zone


def entry(schedule, task: str = "tests.jobs.noop", **fields) -> dict:
    return {"task": task, "schedule": schedule, **fields}


# -- crontabs: every field form celery accepts, checked against celery's own fire times ---

CRONTABS = [
    (crontab(minute=0, hour="*/3"), "0 */3 * * *"),
    (crontab(0, 0, day_of_month="1"), "0 0 1 * *"),
    (crontab(hour=7, minute=30, day_of_week=1), "30 7 * * 1"),
    (crontab(minute="*/15"), "*/15 * * * *"),
    (crontab(hour=3, minute=0), "0 3 * * *"),
    (crontab(minute=0, hour=8, day_of_week="mon-fri"), "0 8 * * mon-fri"),
    (crontab(minute=0, hour=4, day_of_week="sun"), "0 4 * * sun"),
    (crontab(minute=0, hour=9, day_of_week="monday"), "0 9 * * 1"),  # celery reads full names
    (crontab(minute=0, hour="22-2"), "0 0-2,22,23 * * *"),  # celery wraps a reversed range
    (crontab(minute=[0, 30], hour={8, 12, 18}), "0,30 8,12,18 * * *"),
    (crontab(minute="1,13,30-45,50-59/2"), "1,13,30-45,50-59/2 * * * *"),
    (crontab(minute=0, hour="0,8-17/2"), "0 0,8-17/2 * * *"),
    (crontab(0, 0, day_of_month="2-30/2"), "0 0 2-30/2 * *"),
    (crontab(0, 0, day_of_month="1-7,15-21"), "0 0 1-7,15-21 * *"),
    (crontab(0, 6, day_of_month="1", month_of_year="*/3"), "0 6 1 */3 *"),
    (crontab(0, 6, day_of_month=15, month_of_year="jan,jul"), "0 6 15 jan,jul *"),
    (crontab(minute=5, day_of_week="*/2"), "5 * * * */2"),
    (crontab(minute="0, 30", hour="9-17"), "0,30 9-17 * * *"),  # spaces, as celery allows
    # Both day fields, one starting with '*': cron ANDs them as celery does.
    (crontab(0, 0, day_of_month="*/2", day_of_week="1"), "0 0 */2 * 1"),
    (crontab(), "* * * * *"),
]


@pytest.mark.parametrize(("cron", "expression"), CRONTABS, ids=[e for _, e in CRONTABS])
def test_a_crontab_becomes_a_cron_firing_when_celerys_own_crontab_does(
    db, settings, cron, expression
):
    beat(settings, "Asia/Tokyo", nightly=entry(cron))

    run_import()

    imported = Schedule.objects.get(name="nightly")
    assert (imported.cron, imported.timezone) == (expression, "Asia/Tokyo")
    # Celery's fields are sets it computed itself; its remaining_delta walks them.
    expected = celery_fire_times(cron, "Asia/Tokyo", QUIET_WEEK, 40)
    assert imported.next_fire_times(40, after=QUIET_WEEK) == expected


@pytest.mark.parametrize(
    ("zone", "enable_utc", "expected"),
    [
        ("Europe/Berlin", True, "Europe/Berlin"),  # timezone wins over enable_utc
        ("Europe/Berlin", False, "Europe/Berlin"),
        (None, True, "UTC"),  # celery's defaults
        (None, False, "America/Chicago"),  # the local zone, which Django sets to TIME_ZONE
    ],
)
def test_crontabs_run_in_celerys_time_zone(db, settings, zone, enable_utc, expected):
    settings.TIME_ZONE = "America/Chicago"
    cron = crontab(hour=7, minute=30, day_of_week="mon-fri")
    beat(settings, zone, morning=entry(cron))
    settings.CELERY_ENABLE_UTC = enable_utc

    output = run_import()

    imported = Schedule.objects.get(name="morning")
    assert imported.timezone == expected
    assert f"(celery time zone {expected})" in output
    expected_times = celery_fire_times(cron, expected, QUIET_WEEK, 10)
    assert imported.next_fire_times(10, after=QUIET_WEEK) == expected_times


def test_a_crontab_restricting_both_day_fields_is_reported(db, settings):
    beat(settings, first_monday=entry(crontab(0, 9, day_of_month="1-7", day_of_week=1)))

    output = run_import()

    assert not Schedule.objects.exists()
    assert "not imported     'first_monday'" in output
    assert "matching both day_of_month and day_of_week" in output


# -- intervals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "interval"),
    [
        (30.0, timedelta(seconds=30)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=5), timedelta(minutes=5)),
        (schedule(run_every=60), timedelta(minutes=1)),
        (schedule(run_every=timedelta(hours=6)), timedelta(hours=6)),
    ],
    ids=["30.0", "90", "1.5", "timedelta", "schedule(60)", "schedule(timedelta)"],
)
def test_seconds_timedeltas_and_schedules_become_intervals(db, settings, every, interval):
    beat(settings, sync=entry(every))

    run_import()

    assert Schedule.objects.get(name="sync").interval == interval


@pytest.mark.parametrize(
    ("every", "message"),
    [
        (0.5, "The interval (500 ms) must be at least MIN_INTERVAL (1 s)."),
        (-5, "expected a positive duration, found int -5."),
        (0, "expected a positive duration, found int 0."),
        (float("nan"), "expected a positive duration, found float nan."),
        (timedelta(0), "expected a positive duration, found timedelta datetime.timedelta(0)."),
        (1e300, "1e+300 seconds is out of range."),
        ("30", "expected seconds, a timedelta or a schedule, found str '30'."),
        (None, "expected seconds, a timedelta or a schedule, found NoneType None."),
        (True, "expected seconds, a timedelta or a schedule, found bool True."),
        (schedule(run_every=0.2), "The interval (200 ms) must be at least MIN_INTERVAL (1 s)."),
    ],
    ids=[
        "sub-second",
        "negative",
        "zero",
        "nan",
        "0 timedelta",
        "huge",
        "text",
        "None",
        "bool",
        "0.2",
    ],
)
def test_a_bad_interval_is_a_command_error_naming_the_entry_and_field(db, settings, every, message):
    beat(settings, good=entry(60), bad=entry(every))

    with pytest.raises(CommandError) as raised:
        run_import()

    assert str(raised.value).startswith(f"Beat entry 'bad', field 'schedule': {message}")
    assert str(raised.value).endswith(" Nothing was imported.")
    assert not Schedule.objects.exists()


def test_a_relative_interval_is_reported_with_the_reason(db, settings):
    beat(settings, hourly=entry(timedelta(hours=1), relative=True))

    output = run_import()

    assert not Schedule.objects.exists()
    assert "relative=True: beat rounds each fire" in output


# -- schedules with no equivalent -----------------------------------------------------------


def test_a_solar_schedule_is_reported_with_the_reason(db, settings):
    # solar() loads ephem, not installed here: the object, without its __init__.
    dawn = object.__new__(solar)
    dawn.event, dawn.lat, dawn.lon = "sunrise", 52.5, 13.4
    beat(settings, dawn=entry(dawn), sync=entry(60))

    output = run_import()

    assert list(Schedule.objects.values_list("name", flat=True)) == ["sync"]
    assert "not imported     'dawn' (tests.jobs.noop) -> -" in output
    assert "Solar schedules (sunrise at 52.5, 13.4) have no equivalent" in output


class EveryOtherDay(crontab):
    """A schedule class of a project's own (celery's docs show how to write one)."""


def test_a_schedule_class_of_its_own_is_reported_with_the_reason(db, settings):
    beat(settings, custom=entry(EveryOtherDay(minute=0, hour=3)))

    output = run_import()

    assert not Schedule.objects.exists()
    assert f"{__name__}.EveryOtherDay is a schedule class of its own" in output


# -- arguments and options ------------------------------------------------------------------


def test_args_kwargs_and_expires_are_carried_over(db, settings):
    report = entry(
        crontab(minute=0, hour=6),
        task="tests.jobs.add",
        args=(16, 16),
        options={"expires": 3600},
    )
    beat(settings, add=report, greet=entry(60, kwargs={"to": "ops@example.com"}))

    output = run_import()

    add, greet = Schedule.objects.get(name="add"), Schedule.objects.get(name="greet")
    assert (add.job, add.args, add.misfire_grace) == (
        "tests.jobs.add",
        [16, 16],
        timedelta(hours=1),
    )
    assert greet.kwargs == {"to": "ops@example.com"}
    assert "expires 3600 became misfire_grace" in output


def test_an_expires_datetime_becomes_the_end_in_celerys_time_zone(db, settings):
    beat(settings, "Europe/Berlin", ends=entry(60, options={"expires": datetime(2031, 1, 1)}))

    run_import()

    end = datetime(2030, 12, 31, 23, 0, tzinfo=UTC)  # midnight in Berlin, in winter
    assert Schedule.objects.get(name="ends").end_at == end


def test_a_queue_runs_on_the_tasks_backend_the_command_line_names(db, settings):
    routed = {"queue": "reports", "priority": 5, "routing_key": "reports.high"}
    beat(settings, mapped=entry(60, options=routed), unmapped=entry(60, options={"queue": "x"}))

    output = run_import("--queue", "reports=dummy")

    assert Schedule.objects.get(name="mapped").tasks_backend == "dummy"
    assert Schedule.objects.get(name="unmapped").tasks_backend == ""
    assert "-> every 0:01:00, job tests.jobs.noop, tasks backend dummy" in output
    assert "'mapped': Message options (priority 5, routing_key 'reports.high')" in output
    assert "'unmapped': Message options (queue 'x') are not carried over (--queue x=" in output


def test_arguments_that_cannot_be_stored_are_reported(db, settings):
    beat(settings, dated=entry(60, args=(datetime(2030, 1, 1),)))

    output = run_import()

    assert not Schedule.objects.exists()
    assert "args cannot be stored as JSON (Object of type datetime" in output


def test_arguments_the_job_cannot_take_are_reported(db, settings):
    beat(settings, misfit=entry(60, task="tests.jobs.add", args=(1, 2, 3)))

    output = run_import()

    assert not Schedule.objects.exists()
    assert "The arguments do not fit tests.jobs.add()" in output


def test_a_task_runs_the_job_its_job_map_names(db, settings):
    beat(settings, legacy=entry(60, task="proj.tasks.add", args=[1, 2]))

    run_import(job_map=["proj.tasks.add=tests.jobs.add"])

    assert Schedule.objects.get(name="legacy").job == "tests.jobs.add"


def test_what_beat_itself_ignores_of_an_entry_is_listed(db, settings):
    nightly = entry(crontab(minute=0, hour=3), name="other", relative=True, app=None)
    beat(settings, nightly=nightly, counted=entry(60, total_run_count=7))

    output = run_import()

    assert Schedule.objects.count() == 2
    assert "'nightly': Its name key 'other' is ignored: beat names it by its key." in output
    assert "'nightly': Its app key is ignored" in output
    assert "'nightly': relative=True is ignored: beat applies it to seconds" in output
    assert "'counted': History (total_run_count) is not imported" in output


def test_a_nowfun_is_listed_as_not_carried_over(db, settings):
    cron = crontab(minute=0, hour=3, nowfun=lambda: datetime.now(UTC))
    beat(settings, "Europe/Berlin", nightly=entry(cron))

    output = run_import()

    assert Schedule.objects.get().timezone == "Europe/Berlin"
    assert "is not carried over: celery 5 matches a crontab in the app's time zone" in output
