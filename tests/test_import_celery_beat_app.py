"""import_celery_beat on a beat schedule in code: a real Celery app (--app), malformed
entries (an error naming the entry and key, nothing saved), importing again, and
--emit-code, whose module is executed to check it defines the same schedules."""

import asyncio
import importlib
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from celery.schedules import crontab
from django.core.management import CommandError, call_command

from django_periodic import registry
from django_periodic.engine.planning.code_schedules import code_defined_values
from django_periodic.models import Schedule, ScheduleVersion
from tests import celery_app
from tests.helpers import nested_lists

QUIET_WEEK = datetime(2026, 11, 9, 12, 0, tzinfo=UTC)
# The fields a schedule defined by --emit-code's module shares with an imported one.
SHARED_FIELDS = ("cron", "timezone", "interval", "args", "kwargs", "misfire_grace", "end_at")
SHARED_FIELDS += ("tasks_backend",)
# A name whose quotes and backslash the emitted code must keep as they are.
QUOTED = 'say "hi", it\'s C:\\temp'


def run_import(*args, **options) -> str:
    out = StringIO()
    call_command("import_celery_beat", *args, stdout=out, **options)
    return out.getvalue()


# -- a Celery app -------------------------------------------------------------------------


def test_an_apps_beat_schedule_is_imported_in_its_time_zone(db):
    output = run_import("--app", "tests.celery_app:app")

    assert "Beat entries of tests.celery_app:app beat_schedule (celery time zone " in output
    nightly = Schedule.objects.get(name="nightly-report")
    assert (nightly.cron, nightly.timezone) == ("30 7 * * 1", "Europe/Berlin")
    # The app's own crontab, in the app's own time zone, says when beat would fire it.
    cron = celery_app.app.conf.beat_schedule["nightly-report"]["schedule"]
    cron.app = celery_app.app
    after, expected = QUIET_WEEK, []
    for _ in range(5):
        start, remaining, _now = cron.remaining_delta(after)
        after = start + remaining
        expected.append(after.astimezone(UTC))
    assert nightly.next_fire_times(5, after=QUIET_WEEK) == expected
    add = Schedule.objects.get(name="add-every-30-seconds")
    assert (add.interval, add.args) == (timedelta(seconds=30), [16, 16])


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.celery_app", "--app takes module:attribute (e.g. proj.celery:app), got "),
        ("tests.absent:app", "Cannot import the Celery app 'tests.absent:app': No module"),
        ("tests.celery_app:gone", "Cannot import the Celery app 'tests.celery_app:gone': "),
        ("tests.jobs:add", "'tests.jobs:add' is not a Celery app (it has no conf.beat_schedule)."),
        (".:x", "--app takes the module's full dotted path (proj.celery), got '.:x'."),
        (".celery_app:app", "--app takes the module's full dotted path (proj.celery), got "),
    ],
)
def test_an_app_path_that_names_no_app_is_a_command_error(db, path, message):
    with pytest.raises(CommandError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        run_import("--app", path)


# -- malformed settings and entries ---------------------------------------------------------

ENTRY = {"task": "tests.jobs.noop", "schedule": 60}
MALFORMED = [
    ({"bad": ["tests.jobs.noop", 60]}, "Beat entry 'bad': expected a dict (task, schedule, ...), "),
    ({"bad": {"schedule": 60}}, "Beat entry 'bad', field 'task': missing."),
    ({"bad": {**ENTRY, "task": 5}}, "Beat entry 'bad', field 'task': expected a task name, "),
    ({"bad": {**ENTRY, "task": " "}}, "Beat entry 'bad', field 'task': expected a task name, "),
    ({"bad": {"task": "tests.jobs.noop"}}, "Beat entry 'bad', field 'schedule': missing."),
    (
        {"bad": {**ENTRY, "shedule": 60}},
        "Beat entry 'bad', field 'shedule': not a key of a beat entry (it has task, schedule, ",
    ),
    ({"bad": {**ENTRY, "args": "16, 16"}}, "Beat entry 'bad', field 'args': expected a tuple "),
    ({"bad": {**ENTRY, "kwargs": [1]}}, "Beat entry 'bad', field 'kwargs': expected a dict with "),
    ({"bad": {**ENTRY, "kwargs": {1: 2}}}, "Beat entry 'bad', field 'kwargs': expected a dict "),
    (
        {"bad": {**ENTRY, "args": (1, float("nan"))}},
        "Beat entry 'bad', field 'args': args cannot hold NaN: JSON has no NaN or infinity.",
    ),
    (
        {"bad": {**ENTRY, "kwargs": {"limit": float("inf")}}},
        "Beat entry 'bad', field 'kwargs': kwargs cannot hold Infinity: JSON has no NaN ",
    ),
    (
        {"bad": {**ENTRY, "args": nested_lists(500)}},
        "Beat entry 'bad', field 'args': args cannot nest lists and objects more than 32 levels ",
    ),
    ({"bad": {**ENTRY, "options": ()}}, None),  # empty: no options, as beat reads it
    ({"bad": {**ENTRY, "options": [1]}}, "Beat entry 'bad', field 'options': expected a dict "),
    ({"bad": {**ENTRY, "relative": "yes"}}, "Beat entry 'bad', field 'relative': expected True "),
    (
        {"bad": {**ENTRY, "options": {"expires": -1}}},
        "Beat entry 'bad', field 'options.expires': expected a positive number of seconds, ",
    ),
    (
        {"bad": {**ENTRY, "options": {"expires": "1h"}}},
        "Beat entry 'bad', field 'options.expires': expected seconds or a datetime, found str",
    ),
    (
        {"bad": {**ENTRY, "options": {"expires": 4e9}}},
        "Beat entry 'bad', field 'options.expires': misfire_grace must be at most ",
    ),
    (
        {"bad": {**ENTRY, "options": {"queue": 5}}},
        "Beat entry 'bad', field 'options.queue': expected a queue name, found int 5.",
    ),
    ({5: ENTRY}, "CELERY_BEAT_SCHEDULE: an entry's name must be text, not 5."),
    ([ENTRY], "CELERY_BEAT_SCHEDULE must be a dict of entries, not list "),
]


@pytest.mark.parametrize(("entries", "message"), MALFORMED, ids=[m or "ok" for _, m in MALFORMED])
def test_a_malformed_entry_is_a_command_error_and_nothing_is_saved(db, settings, entries, message):
    # A good entry first: it is not saved either.
    settings.CELERY_BEAT_SCHEDULE = (
        {"good": ENTRY, **entries} if isinstance(entries, dict) else entries
    )
    if message is None:
        run_import("--from-settings")
        assert Schedule.objects.count() == 2
        return

    with pytest.raises(CommandError) as raised:
        run_import("--from-settings")

    assert str(raised.value).startswith(message), str(raised.value)
    assert str(raised.value).endswith(" Nothing was imported.")
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("CELERY_TIMEZONE", "Mars/Olympus", "Field 'CELERY_TIMEZONE': Unknown time zone"),
        ("CELERY_TIMEZONE", 5, "Field 'CELERY_TIMEZONE': expected a time zone name, found 5."),
        ("CELERY_ENABLE_UTC", "yes", "Field 'CELERY_ENABLE_UTC': expected True or False, "),
    ],
)
def test_a_malformed_time_zone_setting_is_a_command_error(db, settings, key, value, message):
    settings.CELERY_BEAT_SCHEDULE = {"good": ENTRY}
    setattr(settings, key, value)

    with pytest.raises(CommandError, match="^" + message):
        run_import("--from-settings")


def test_a_missing_setting_is_a_command_error_naming_the_old_one(db, settings):
    settings.CELERYBEAT_SCHEDULE = {"good": ENTRY}

    with pytest.raises(CommandError) as raised:
        run_import("--from-settings")

    assert str(raised.value) == (
        "The CELERY_BEAT_SCHEDULE setting is missing (CELERYBEAT_SCHEDULE is its old name: "
        "read it with --app)."
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "a=dummy"], "--queue reads a beat schedule in code: add --from-settings "),
        (["--from-settings", "--queue", "reports"], "--queue takes QUEUE=ALIAS, got 'reports'."),
        (["--from-settings", "--queue", "a=nope"], "--queue a=nope: 'nope' is not a backend of "),
        (["--from-settings", "--emit-code", "--update"], "--emit-code saves nothing: --update "),
    ],
)
def test_options_that_do_not_apply_are_a_command_error(db, settings, args, message):
    settings.CELERY_BEAT_SCHEDULE = {"good": ENTRY}

    with pytest.raises(CommandError) as raised:
        run_import(*args)

    assert str(raised.value).startswith(message)


# -- importing again ------------------------------------------------------------------------


def test_importing_again_skips_and_update_overwrites_with_a_version(db, settings):
    settings.CELERY_BEAT_SCHEDULE = {"sync": ENTRY}
    run_import("--from-settings")
    settings.CELERY_BEAT_SCHEDULE = {"sync": {**ENTRY, "schedule": crontab(minute="*/15")}}

    again = run_import("--from-settings")
    assert Schedule.objects.get().interval == timedelta(minutes=1)
    assert "0 created, 0 updated, 1 skipped, 0 not imported." in again

    run_import("--from-settings", update=True)

    updated = Schedule.objects.get()
    assert (updated.cron, updated.interval) == ("*/15 * * * *", None)
    versions = ScheduleVersion.objects.filter(schedule=updated).order_by("pk")
    assert [v.by for v in versions] == ["import", "import"]
    assert "beat entry 'sync' (tests.jobs.noop)" in versions.last().reason


def test_a_dry_run_saves_nothing_and_paused_imports_disabled(db, settings):
    settings.CELERY_BEAT_SCHEDULE = {"sync": ENTRY}

    assert "Dry run, nothing saved: 1 would create" in run_import("--from-settings", dry_run=True)
    assert not Schedule.objects.exists()
    run_import("--from-settings", paused=True)
    assert not Schedule.objects.get().enabled


# -- --emit-code ------------------------------------------------------------------------------


def emitted_module(tmp_path, output: str, name: str):
    """Import --emit-code's output as module ``name``, as a project would keep it."""
    (tmp_path / f"{name}.py").write_text(output)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_emitted_code_defines_the_schedules_the_import_creates(db, tmp_path, clean_registry):
    output = run_import("--app", "tests.celery_app:app", "--queue", "reports=dummy", emit_code=True)
    assert not Schedule.objects.exists()  # nothing is written

    module = emitted_module(tmp_path, output, "emitted_beat")

    run_import("--app", "tests.celery_app:app", "--queue", "reports=dummy")
    for imported in Schedule.objects.all():
        defined = code_defined_values(registry.get_job(imported.name))
        assert {k: defined[k] for k in SHARED_FIELDS} == {
            k: getattr(imported, k) for k in SHARED_FIELDS
        }
    assert defined["defined_in"].startswith("emitted_beat:")
    # Each job runs the task's job with the schedule's arguments: 16 + 16.
    assert module.add_every_30_seconds(16, 16) == 32


def test_emitted_code_keeps_context_async_and_lists_what_it_cannot_emit(
    db, settings, tmp_path, clean_registry
):
    settings.CELERY_BEAT_SCHEDULE = {
        "record": {"task": "tests.jobs.record", "schedule": 60, "kwargs": {"seconds": 0}},
        "later": {"task": "tests.jobs.add_later", "schedule": 60, "args": [1, 2]},
        "tests.jobs.noop": {"task": "tests.jobs.noop", "schedule": crontab(minute=0)},
        "tests.jobs.add": {**ENTRY, "schedule": 30},  # another job's name
        "gone": {"task": "legacy.tasks.gone\nprint('injected')", "schedule": 60},
        "ends": {**ENTRY, "options": {"expires": datetime(2031, 1, 1, tzinfo=UTC)}},
        QUOTED: {**ENTRY, "kwargs": {"note": QUOTED}},
    }

    output = run_import("--from-settings", emit_code=True)
    module = emitted_module(tmp_path, output, "emitted_settings")

    assert registry.get_job("record").takes_context
    assert asyncio.run(module.later(1, 2)) == 3
    ends = code_defined_values(registry.get_job("ends"))
    assert ends["end_at"] == datetime(2031, 1, 1, tzinfo=UTC)
    assert "#   beat entry 'tests.jobs.noop' (tests.jobs.noop): it has its job's name: " in output
    assert '@job(...) these options: cron="0 * * * *", timezone="UTC"' in output
    assert "#   beat entry 'gone' (legacy.tasks.gone\\nprint('injected')): job: No job" in output
    assert "#   beat entry 'tests.jobs.add' (tests.jobs.noop): a job has its name already" in output
    assert "gone" not in registry.registered_jobs()
    assert code_defined_values(registry.get_job(QUOTED))["kwargs"] == {"note": QUOTED}
