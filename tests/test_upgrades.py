"""Upgrades without downtime: the previous release keeps working on this release's schema.

During a rolling deploy, ``migrate`` runs first and processes of the previous release go on
inserting rows that do not name the columns added since. Every NOT NULL column whose value the
code supplies therefore needs a database default too (docs/deployment.md, "Upgrading").
"""

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.db.models import Count, Field, Model
from django.db.models.expressions import Value

from django_periodic.db import clock
from django_periodic.models import ConcurrencyLimit, Run, Schedule, SchedulerProcess, limits
from tests import crash, previous_release, processes
from tests.models import Execution
from tests.processes import wait_for

# Columns without a database default, each because every release that can meet this schema
# passes its value on every insert, so no process ever leaves it to the database.
EXEMPT = {
    # The project's TIME_ZONE: a migration cannot carry a setting, and a fixed zone would
    # differ from the Python default. Every release has set it since the table's first
    # migration.
    ("Schedule", "timezone"): "every release sets it; its value is a setting",
    ("Calendar", "timezone"): "every release sets it; its value is a setting",
    # The lease's guard, a fresh uuid4 that the claim itself writes (in SQL on PostgreSQL):
    # every release passes it, and RandomUUID() would be PostgreSQL only.
    ("Lease", "token"): "every release's claim writes it",
}


def code_supplied(field: Field) -> bool:
    """Whether Django fills the field in when an insert does not name it: a ``default``, the
    empty string of a blank text field, or ``auto_now``/``auto_now_add``."""
    if field.null or field.primary_key:
        return False
    blank_text = field.blank and field.empty_strings_allowed
    auto = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
    return field.has_default() or blank_text or auto


def code_supplied_fields() -> list[tuple[type[Model], Field]]:
    config = apps.get_app_config("django_periodic")
    return [
        (model, field)
        for model in config.get_models()
        for field in model._meta.concrete_fields
        if code_supplied(field)
    ]


def test_every_column_the_code_supplies_has_a_database_default():
    missing = [
        f"{model.__name__}.{field.name}"
        for model, field in code_supplied_fields()
        if not field.has_db_default() and (model.__name__, field.name) not in EXEMPT
    ]
    assert not missing, f"without a database default (add db_default= beside default=): {missing}"


def test_every_exemption_names_a_field_without_a_database_default():
    """A stale exemption would hide nothing, but would say something untrue."""
    fields = {(model.__name__, field.name): field for model, field in code_supplied_fields()}
    for key in EXEMPT:
        assert key in fields, key
        assert not fields[key].has_db_default(), key


def test_database_defaults_equal_the_python_ones():
    """Where both are constants, a row the database completes reads as one the code made."""
    for model, field in code_supplied_fields():
        db_default = field.db_default
        if not isinstance(db_default, Value) or not field.has_default():
            continue  # an expression (Now()), or no db_default (the exemptions)
        default = field.default() if callable(field.default) else field.default
        assert db_default.value == default, f"{model.__name__}.{field.name}"


# Fast heartbeats and sweeps, and a short graceful stop, as in the crash suite.
CHILD_SETTINGS = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1, "SHUTDOWN_GRACE": 2}
# Log lines that would mean a process failed on the schema or otherwise.
FAILURES = ("Traceback", "IntegrityError", "NotNullViolation", "violates not-null")


@pytest.fixture
def previous(postgres, transactional_db, tmp_path) -> Iterator[Path]:
    """The previous release's checkout (tests/previous_release.py)."""
    with previous_release.worktree(tmp_path) as path:
        yield path


def create_in_previous_release(path: Path, name: str, start: datetime) -> None:
    """The previous release creates a schedule through its own ORM, on this schema; and its
    code is its own, not this checkout's (the virtualenv has ours installed, editable)."""
    printed = previous_release.shell(
        path,
        "import datetime, django_periodic, tests\n"
        "from django_periodic.models import Schedule\n"
        f"Schedule(name={name!r}, job='tests.jobs.record', start_at="
        f"datetime.datetime.fromisoformat({start.isoformat()!r}),"
        " interval=datetime.timedelta(seconds=1)).save()\n"
        "print(django_periodic.__file__)\n"
        "print(tests.__file__)\n",
    )
    assert printed.split() == [
        str(path / "django_periodic" / "__init__.py"),
        str(path / "tests" / "__init__.py"),
    ]


def create_in_this_release(name: str, start: datetime) -> None:
    Schedule(
        name=name, job="tests.jobs.record", interval=timedelta(seconds=1), start_at=start
    ).save()


def wait_for_executions(count: int, after: int = 0, **filters: object) -> int:
    """Wait until ``count`` jobs (by ``filters``: a process's pid, a schedule) ran since the
    execution ``after``; return the id of the last execution."""
    done = Execution.objects.filter(pk__gt=after, **filters)
    wait_for(lambda: done.count() >= count, 30, f"{count} executions ({filters})")
    return Execution.objects.latest("pk").pk


def assert_every_plan_time_ran_once() -> None:
    """Effects, not only the ledger: one job execution per succeeded run, none otherwise."""
    succeeded = Run.objects.filter(status=Run.Status.SUCCEEDED)
    ran = set(succeeded.values_list("schedule__name", "plan_time"))
    executions = Execution.objects.values("schedule", "plan_time").annotate(n=Count("pk"))
    assert {(row["schedule"], row["plan_time"]) for row in executions} == ran
    assert {row["n"] for row in executions} == {1}


def assert_nothing_failed(*schedulers: crash.LoggedChild) -> None:
    assert not Run.objects.filter(status=Run.Status.FAILED).exists()
    assert set(Schedule.objects.values_list("last_error", "planning_failures")) == {("", 0)}
    for scheduler in schedulers:
        failures = [line for line in scheduler.output().splitlines() if line.startswith(FAILURES)]
        assert not failures, scheduler.tail()


@pytest.mark.upgrade
@pytest.mark.processes
def test_the_previous_release_runs_beside_this_one_on_this_schema(previous, tmp_path):
    """A rolling deploy after ``migrate``: the previous release alone, then both, then this
    one alone. Each creates schedules; each plans and runs both releases' schedules."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    create_in_previous_release(previous, "previous", start)
    create_in_this_release("this", start)
    old = previous_release.Scheduler(
        previous, "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "previous.log"
    )
    new = None
    try:
        # The previous release alone plans and runs both releases' schedules.
        wait_for_executions(3, pid=old.pid, schedule="previous")
        last = wait_for_executions(3, pid=old.pid, schedule="this")
        # Both (which of them plans or runs a fire is theirs to settle), while each creates
        # one more schedule.
        new = crash.LoggedChild(
            "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "this.log"
        )
        wait_for(SchedulerProcess.objects.filter(pid=new.pid).exists, 30, "this one to start")
        now = clock.now().replace(microsecond=0)
        create_in_previous_release(previous, "previous, mixed", now)
        create_in_this_release("this, mixed", now)
        wait_for_executions(3, after=last, schedule="previous, mixed")
        wait_for_executions(3, after=last, schedule="this, mixed")
        assert old.terminate() == 0, old.tail()
        # This release alone plans and runs them all.
        last = Execution.objects.latest("pk").pk
        for name in ("previous", "this", "previous, mixed", "this, mixed"):
            wait_for_executions(2, after=last, pid=new.pid, schedule=name)
        assert new.terminate() == 0, new.tail()
    except AssertionError as exc:
        logs = "\n".join(f"{child.log_path.name}:\n{child.tail()}" for child in (old, new) if child)
        raise AssertionError(f"{exc}\n{logs}") from None
    finally:
        for child in (old, new):
            if child is not None:
                child.kill()
        processes.wait_for_children_to_disconnect()
    assert_every_plan_time_ran_once()
    assert_nothing_failed(old, new)


@pytest.mark.upgrade
@pytest.mark.processes
def test_the_previous_release_leaves_a_schedule_that_runs_after_others_alone(previous, tmp_path):
    """A downstream schedule has no cursor: the previous release, which knows nothing of
    ``after``, neither plans, fails nor disables it while it runs its upstream; this
    release then runs it for the upstream's plan times."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    create_in_this_release("upstream", start)
    Schedule(name="downstream", job="tests.jobs.record", after=["upstream"]).save()
    old = previous_release.Scheduler(
        previous, "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "previous.log"
    )
    new = None
    try:
        wait_for_executions(3, pid=old.pid, schedule="upstream")
        assert old.terminate() == 0, old.tail()
        downstream = Schedule.objects.get(name="downstream")
        assert not Run.objects.filter(schedule=downstream).exists()
        left_alone = (True, "", 0, None)
        assert (
            downstream.enabled, downstream.last_error, downstream.planning_failures,
            downstream.next_fire_at,
        ) == left_alone  # fmt: skip
        new = crash.LoggedChild(
            "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "this.log"
        )
        wait_for_executions(3, schedule="downstream")
        assert new.terminate() == 0, new.tail()
    finally:
        for child in (old, new):
            if child is not None:
                child.kill()
        processes.wait_for_children_to_disconnect()
    assert_every_plan_time_ran_once()


@pytest.mark.upgrade
@pytest.mark.processes
def test_the_previous_release_never_starts_a_limited_run(previous, tmp_path):
    """The previous release knows nothing of concurrency limits: it plans a limited
    schedule's fires, but the database holds their runs as it inserts them, so it never
    starts one; this release then admits and runs them."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    create_in_this_release("unlimited", start)
    limit = ConcurrencyLimit.objects.create(name="one", max_running=1)
    Schedule(
        name="limited", job="tests.jobs.record", interval=timedelta(seconds=1), start_at=start,
        concurrency_limit=limit, overlap=Schedule.Overlap.CONCURRENT,
    ).save()  # fmt: skip
    old = previous_release.Scheduler(
        previous, "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "previous.log"
    )
    new = None
    try:
        wait_for_executions(3, pid=old.pid, schedule="unlimited")
        assert old.terminate() == 0, old.tail()
        planned = Run.objects.filter(schedule__name="limited")
        assert planned.count() >= 2  # planned by the previous release...
        assert set(planned.values_list("concurrency_limit", "release_at")) == {
            (limit.pk, limits.HELD)
        }  # ...and held
        assert not Execution.objects.filter(schedule="limited").exists()
        new = crash.LoggedChild(
            "--workers", "2", settings=CHILD_SETTINGS, log_path=tmp_path / "this.log"
        )
        wait_for_executions(3, schedule="limited")
        assert new.terminate() == 0, new.tail()
    finally:
        for child in (old, new):
            if child is not None:
                child.kill()
        processes.wait_for_children_to_disconnect()
    assert_every_plan_time_ran_once()
