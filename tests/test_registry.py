from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_periodic import checks, job, registry
from django_periodic.engine.planning import code_schedules
from django_periodic.models import Run, Schedule


def test_jobs_are_registered_by_module_and_qualname():
    found = registry.get_job("tests.jobs.add")
    assert found.description == "Adds two numbers."
    assert found.func(1, 2) == 3


def test_an_unknown_job_name_raises_a_clear_error():
    with pytest.raises(registry.UnknownJob, match="nope"):
        registry.get_job("nope")


def test_decorating_returns_the_function_unchanged(clean_registry):
    def hello():
        return "hi"

    assert job(name="hello")(hello) is hello
    assert registry.get_job("hello").func is hello


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "* * * * *", "interval": timedelta(1)}, "exactly one"),
        ({"max_attempts": 3}, "exactly one"),
        ({"interval": 5}, "timedelta"),
    ],
)
def test_bad_code_schedules_fail_at_import(clean_registry, options, message):
    with pytest.raises(TypeError, match=message):
        job(name="bad", **options)(lambda: None)


@pytest.mark.django_db  # Django 6's check command also runs the database checks
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "* * * * *", "colour": "blue"}, "unknown options: colour"),
        ({"interval": timedelta(0)}, "The interval must be positive"),
        ({"cron": "* * * * *", "job_timeout": 3}, "unknown options: job_timeout"),
        ({"cron": "* * * * *", "scopes": "billing.nope"}, "No scope provider named"),
    ],
)
def test_a_code_schedule_that_is_no_valid_schedule_fails_the_system_checks(
    clean_registry, options, message
):
    job(name="bad", **options)(lambda: None)
    (error,) = checks.check_code_schedules()
    assert (error.id, error.obj) == ("django_periodic.E004", registry.get_job("bad").defined_in)
    assert message in error.msg
    with pytest.raises(SystemCheckError, match="E004"):
        call_command("check")


def test_valid_code_schedules_pass_the_system_checks():
    assert checks.check_code_schedules() == []


def test_a_bad_cron_in_code_fails_at_import(clean_registry):
    with pytest.raises(ValueError, match="minute"):
        job(name="bad", cron="99 * * * *")(lambda: None)


def test_the_same_name_twice_is_refused(clean_registry):
    job(name="twice")(lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        job(name="twice")(lambda: 1)


@pytest.mark.django_db
def test_sync_creates_updates_and_disables_code_schedules(clean_registry):
    def nightly():
        return None

    job(name="nightly", cron="0 3 * * *", max_attempts=2)(nightly)
    report = code_schedules.sync_code_schedules()
    schedule = Schedule.objects.get(name="nightly")
    assert report.created == ["nightly"]
    assert (schedule.cron, schedule.max_attempts, schedule.enabled) == ("0 3 * * *", 2, True)
    assert schedule.defined_in.startswith("tests.test_registry:")

    assert code_schedules.sync_code_schedules().updated == []

    registry._registry.pop("nightly")
    job(name="nightly", cron="0 4 * * *")(nightly)
    assert code_schedules.sync_code_schedules().updated == ["nightly"]
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.max_attempts) == ("0 4 * * *", 1)

    Run.objects.create(schedule=schedule, plan_time=schedule.next_fire_at, job_name="nightly")
    registry._registry.pop("nightly")
    assert code_schedules.sync_code_schedules().disabled == ["nightly"]
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "No longer defined in code" in schedule.last_error
    assert schedule.runs.count() == 1  # history stays


@pytest.mark.django_db
def test_sync_keeps_a_pause_made_in_the_admin(clean_registry):
    job(name="hourly", cron="@hourly")(lambda: None)
    code_schedules.sync_code_schedules()
    Schedule.objects.filter(name="hourly").update(enabled=False)
    code_schedules.sync_code_schedules()
    assert not Schedule.objects.get(name="hourly").enabled


@pytest.mark.django_db
def test_a_code_schedule_that_does_not_validate_is_reported_and_the_rest_sync(clean_registry):
    job(name="needs_args", cron="@daily")(lambda a: a)  # no args given: cannot be called
    job(name="fine", cron="@daily")(lambda: None)
    report = code_schedules.sync_code_schedules()
    assert report.invalid == ["needs_args"]
    assert report.created == ["fine"]


@pytest.mark.django_db
def test_a_code_schedule_may_hand_its_runs_to_a_tasks_backend(clean_registry):
    @job(name="indexing", cron="0 3 * * *", tasks_backend="dummy")
    def rebuild() -> None: ...

    code_schedules.sync_code_schedules()
    schedule = Schedule.objects.get(name="indexing")
    assert schedule.tasks_backend == "dummy"
    assert schedule.run_now().tasks_backend == "dummy"


def test_a_code_schedule_may_fan_out_over_a_registered_provider(clean_registry):
    job(name="per_region", takes_context=True, cron="0 2 * * *", scopes="tests.regions")(
        lambda context: context.scope
    )
    assert checks.check_code_schedules() == []


def test_scope_providers_are_registered_by_module_and_qualname():
    from django_periodic import scopes

    found = scopes.get_provider("tests.jobs.tenants")
    assert found.description == "The tenants of the tests (TENANTS)."
    with pytest.raises(scopes.UnknownProvider, match=r"Registered: .*tests\.regions"):
        scopes.get_provider("nope")


def test_a_job_whose_source_file_is_not_python_still_says_where_it_is(clean_registry):
    namespace = {"__name__": "notebook"}
    source = "from django_periodic import job\n\n\n@job(name='from.notebook')\ndef task(): ...\n"
    exec(compile(source, "notes.md", "exec"), namespace)  # inspect cannot read notes.md
    assert registry.get_job("from.notebook").defined_in == "notebook:4"
