"""Fan-out per scope: one run per scope key of each fire, each with its own overlap policy."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, connections, transaction

from django_periodic import scopes
from django_periodic.engine import overlap
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import retries
from django_periodic.models import Run, Schedule
from django_periodic.testing import run_due
from tests import jobs
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import fire, set_cursor
from tests.threads import Thread

pytestmark = pytest.mark.pgbouncer

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY = timedelta(seconds=10)
TENANTS = "tests.jobs.tenants"


@pytest.fixture(autouse=True)
def provider_calls():
    jobs.PROVIDER_CALLS.clear()
    yield jobs.PROVIDER_CALLS
    jobs.PROVIDER_CALLS.clear()


def fanned_out(cursor=T0, **fields) -> Schedule:
    """A 10-second interval schedule of per_tenant, fanned out over the tenants, due at
    ``cursor``."""
    fields = {"job": "tests.jobs.per_tenant", "scopes": TENANTS, "interval": EVERY, **fields}
    schedule = ScheduleFactory(start_at=T0, misfire_grace=timedelta(minutes=1), **fields)
    set_cursor(schedule, cursor)
    schedule.refresh_from_db()
    return schedule


def runs_by_scope(schedule: Schedule, **filters) -> dict[str, list[tuple[str, str]]]:
    """(status, error_code) of each scope's runs, oldest first."""
    found: dict[str, list[tuple[str, str]]] = {}
    for run in Run.objects.filter(schedule=schedule, **filters).order_by("plan_time", "pk"):
        found.setdefault(run.scope, []).append((run.status, run.error_code))
    return found


def end(schedule: Schedule, scope: str, status: str = "succeeded") -> None:
    Run.objects.filter(schedule=schedule, scope=scope, status="pending").update(status=status)


@pytest.mark.django_db
def test_a_fire_records_one_run_per_scope_key_and_moves_the_cursor_once():
    schedule = fanned_out()
    result = planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    runs = Run.objects.filter(schedule=schedule)
    assert sorted(runs.values_list("scope", "plan_time", "status")) == [
        ("7", T0, "pending"),
        ("acme", T0, "pending"),
        ("globex", T0, "pending"),
    ]
    assert (result.fired, result.skipped) == (3, 0)
    assert schedule.next_fire_at == T0 + EVERY


@pytest.mark.django_db
def test_planning_a_fire_again_records_no_scope_twice():
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    fire(schedule, T0)  # the same plan time once more, as after a lost cursor update
    assert runs_by_scope(schedule) == {key: [("pending", "")] for key in ("acme", "globex", "7")}


@pytest.mark.django_db
def test_the_database_allows_one_active_run_per_scope_not_per_schedule():
    schedule = fanned_out()
    RunFactory(schedule=schedule, scope="acme", plan_time=T0, status="running")
    RunFactory(schedule=schedule, scope="globex", plan_time=T0, status="running")
    with pytest.raises(IntegrityError), transaction.atomic():
        RunFactory(schedule=schedule, scope="acme", plan_time=T0 + EVERY, status="pending")


@pytest.mark.django_db(transaction=True)
def test_the_provider_is_called_once_per_fire_outside_the_planning_transaction(provider_calls):
    fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    planner.plan_due(T0 + timedelta(seconds=2))  # not due again: no call
    assert provider_calls == [False]


@pytest.mark.django_db
def test_no_scope_key_records_no_run_but_the_cursor_moves(monkeypatch):
    monkeypatch.setattr(jobs, "TENANTS", [])
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    assert not Run.objects.filter(schedule=schedule).exists()
    assert (schedule.next_fire_at, schedule.last_error) == (T0 + EVERY, "")


@pytest.mark.django_db
def test_a_provider_that_raises_fails_planning_until_it_works_again(monkeypatch, settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 3}
    monkeypatch.setattr(jobs, "TENANTS", RuntimeError("accounts service down"))
    schedule = fanned_out()
    result = planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    assert result.failed == [schedule.name]
    assert "accounts service down" in schedule.last_error
    assert (schedule.planning_failures, schedule.next_fire_at) == (1, T0)
    assert not Run.objects.filter(schedule=schedule).exists()

    monkeypatch.setattr(jobs, "TENANTS", ["acme"])
    planner.plan_due(T0 + timedelta(seconds=2))
    schedule.refresh_from_db()
    assert (schedule.planning_failures, schedule.last_error) == (0, "")
    assert runs_by_scope(schedule) == {"acme": [("pending", "")]}


@pytest.mark.django_db
def test_a_failing_provider_disables_its_schedule_after_the_limit(monkeypatch, settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 2}
    monkeypatch.setattr(jobs, "TENANTS", RuntimeError("down"))
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    result = planner.plan_due(T0 + timedelta(seconds=2))
    schedule.refresh_from_db()
    assert result.disabled == [schedule.name]
    assert (schedule.enabled, schedule.next_fire_at) == (False, T0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("acme", "returned a str, not a list"),
        ({"acme"}, "returned a set, not a list"),
        (["acme", None], "key of type NoneType"),
        (["acme", True], "key of type bool"),
        (["acme", ""], "1 to 200 characters"),
        (["acme", "x" * 201], "1 to 200 characters"),
    ],
)
def test_a_provider_returning_anything_but_short_keys_records_nothing(
    monkeypatch, returned, message
):
    monkeypatch.setattr(jobs, "TENANTS", returned)
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    assert message in schedule.last_error
    assert (schedule.planning_failures, schedule.next_fire_at) == (1, T0)
    assert not Run.objects.filter(schedule=schedule).exists()


def test_keys_are_strings_in_order_without_repeats(monkeypatch):
    monkeypatch.setattr(jobs, "TENANTS", (3, "b", "a", 3, "b"))
    assert scopes.scope_keys(TENANTS) == ["3", "b", "a"]


@pytest.mark.django_db(transaction=True)
def test_a_fire_planned_by_someone_else_meanwhile_is_left_alone(monkeypatch, provider_calls):
    schedule = fanned_out()

    def another_planner_first():
        # While this planner calls the provider, another one plans the fire (moves the cursor).
        set_cursor(schedule, T0 + EVERY)
        return ["acme"]

    monkeypatch.setattr(jobs, "TENANTS", another_planner_first)
    result = planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    assert (result.fired, result.failed) == (0, [])
    assert (schedule.next_fire_at, schedule.planning_failures) == (T0 + EVERY, 0)
    assert not Run.objects.filter(schedule=schedule).exists()


@pytest.mark.django_db
def test_overlap_is_judged_per_scope(monkeypatch):
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    end(schedule, "acme")
    end(schedule, "globex")
    fire(schedule, T0 + EVERY)
    assert runs_by_scope(schedule) == {
        "acme": [("succeeded", ""), ("pending", "")],
        "globex": [("succeeded", ""), ("pending", "")],
        "7": [("pending", ""), ("skipped", "overlap")],
    }


@pytest.mark.django_db
def test_max_concurrent_caps_each_scope(monkeypatch):
    schedule = fanned_out(overlap="concurrent", max_concurrent=1)
    planner.plan_due(T0 + timedelta(seconds=1))
    fire(schedule, T0 + EVERY)
    statuses = runs_by_scope(schedule)
    assert statuses == {key: [("pending", ""), ("skipped", "overlap")] for key in statuses}
    assert len(statuses) == 3


@pytest.mark.django_db
def test_a_queued_run_is_promoted_when_its_own_scope_is_free():
    schedule = fanned_out(overlap="queue")
    planner.plan_due(T0 + timedelta(seconds=1))
    fire(schedule, T0 + EVERY)
    assert {runs[1] for runs in runs_by_scope(schedule).values()} == {("queued", "")}
    end(schedule, "acme")
    assert overlap.promote_queued("default", [schedule.pk]) == 1
    assert runs_by_scope(schedule)["acme"] == [("succeeded", ""), ("pending", "")]
    assert runs_by_scope(schedule)["globex"] == [("pending", ""), ("queued", "")]


@pytest.mark.django_db
def test_a_new_fire_supersedes_the_waiting_retry_of_its_own_scope_only(monkeypatch):
    schedule = fanned_out()
    planner.plan_due(T0 + timedelta(seconds=1))
    end(schedule, "acme", "retrying")
    end(schedule, "7", "retrying")
    end(schedule, "globex")
    monkeypatch.setattr(jobs, "TENANTS", ["acme", "globex"])  # no fire for "7" this time
    fire(schedule, T0 + EVERY)
    assert runs_by_scope(schedule) == {
        "acme": [("failed", "superseded"), ("pending", "")],
        "globex": [("succeeded", ""), ("pending", "")],
        "7": [("retrying", "")],
    }


@pytest.mark.django_db
def test_unscoped_schedules_plan_alongside_fanned_out_ones():
    scoped = fanned_out()
    plain = ScheduleFactory(interval=EVERY, start_at=T0)
    set_cursor(plain, T0)
    result = planner.plan_due(T0 + timedelta(seconds=1))
    assert result.fired == 4
    assert runs_by_scope(plain) == {"": [("pending", "")]}
    assert len(runs_by_scope(scoped)) == 3


@pytest.mark.django_db
def test_a_scoped_run_reads_its_scope_from_its_context():
    fanned_out()
    runs = run_due(now=T0 + timedelta(seconds=1))
    assert {run.scope: (run.status, run.result) for run in runs} == {
        "acme": ("succeeded", "hello acme"),
        "globex": ("succeeded", "hello globex"),
        "7": ("succeeded", "hello 7"),
    }


@pytest.mark.django_db
def test_run_now_on_a_fanned_out_schedule_names_its_scope():
    schedule = fanned_out()
    with pytest.raises(ValueError, match="fanned out per scope"):
        schedule.run_now()
    run = schedule.run_now(scope="acme")
    assert (run.scope, run.trigger, run.status) == ("acme", "manual", "pending")
    runs = schedule.run_now_for_all_scopes()
    assert [(r.scope, r.status, r.error_code) for r in runs] == [
        ("acme", "skipped", "overlap"),  # acme's manual run above is in flight
        ("globex", "pending", ""),
        ("7", "pending", ""),
    ]


@pytest.mark.django_db
def test_retrying_a_failed_scoped_run_keeps_its_scope(now):
    schedule = fanned_out()
    failed = RunFactory(schedule=schedule, scope="globex", plan_time=T0, status="failed")
    retry = retries.plan_retry(failed, now)
    assert (retry.scope, retry.trigger, retry.status) == ("globex", "retry", "pending")


@pytest.mark.django_db
def test_scopes_must_name_a_registered_provider():
    schedule = ScheduleFactory.build(job="tests.jobs.per_tenant", scopes="billing.nope")
    with pytest.raises(ValidationError) as raised:
        schedule.full_clean()
    (message,) = raised.value.message_dict["scopes"]
    assert "No scope provider named 'billing.nope'" in message
    assert "tests.jobs.tenants" in message  # the registered ones are listed


@pytest.mark.django_db
def test_a_fanned_out_job_must_take_its_context():
    schedule = ScheduleFactory.build(job="tests.jobs.noop", scopes=TENANTS)
    with pytest.raises(ValidationError) as raised:
        schedule.full_clean()
    assert "context.scope" in raised.value.message_dict["scopes"][0]


@pytest.mark.django_db
def test_a_fire_fanned_out_to_many_scopes_costs_a_constant_number_of_queries(postgres, monkeypatch):
    # SQLite caps query parameters, so Django splits its bulk statements there.
    queries = []

    def counter(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    def plan(count):
        monkeypatch.setattr(jobs, "TENANTS", list(range(count)))
        schedule = fanned_out()
        queries.clear()
        with connection.execute_wrapper(counter):
            planner.plan_due(T0 + timedelta(seconds=1))
        assert Run.objects.filter(schedule=schedule).count() == count
        Schedule.objects.all().delete()
        return len(queries)

    assert plan(3) == plan(2_000) <= 14


@pytest.mark.django_db(transaction=True)
def test_two_planners_racing_for_one_fire_record_each_scope_once(postgres, monkeypatch):
    schedule = fanned_out()
    # The second planner starts once the first is in the provider (its first transaction
    # over), so it finds the fire due too; neither goes on until both have called it.
    first_called = threading.Event()
    both_called = threading.Barrier(2, timeout=30)

    def provider():
        first_called.set()
        both_called.wait()
        return ["acme", "globex"]

    monkeypatch.setattr(jobs, "TENANTS", provider)
    results = []

    def plan():
        try:
            results.append(planner.plan_due(T0 + timedelta(seconds=1)))
        finally:
            connections.close_all()

    threads = [Thread(target=plan) for _ in range(2)]
    threads[0].start()
    assert first_called.wait(timeout=30)
    threads[1].start()
    for thread in threads:
        thread.join()
    assert sorted(result.fired for result in results) == [0, 2]
    assert runs_by_scope(schedule) == {"acme": [("pending", "")], "globex": [("pending", "")]}
