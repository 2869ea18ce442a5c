"""Concurrency limits: a limit's schedules never hold more slots than it has, across
processes; a run that finds its limit full waits, oldest plan time first, and past its
start deadline is skipped with a code that names the limit.

Oracles outside the ledger: the rows and notes the jobs write when they start and end."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import ProtectedError
from django.test.utils import CaptureQueriesContext

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims, handoff, leases
from django_periodic.engine.runs.admission import Admission, admit
from django_periodic.models import ConcurrencyLimit, Run, Schedule, limits
from django_periodic.testing import run_due
from tests.factories import ScheduleFactory
from tests.limits_oracle import jobs_of, most_at_once
from tests.models import Execution
from tests.test_handoff import deliver, dummy  # noqa: F401 (a fixture)
from tests.test_signals import received  # noqa: F401 (a fixture)
from tests.test_wakeups import payloads, raw_listen  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def limited(limit: ConcurrencyLimit, name: str, **fields) -> Schedule:
    schedule = ScheduleFactory(name=name, concurrency_limit=limit, **fields)
    Schedule.objects.filter(pk=schedule.pk).update(created_at=T0 - timedelta(days=1))
    return schedule


def held_run(schedule: Schedule, plan_time: datetime, **fields) -> Run:
    """A run as planning records it for a limited schedule."""
    run = Run.for_schedule(schedule, plan_time, **fields)
    run.save()
    return run


def started(runs) -> list[str]:
    admitted = Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(release_at=limits.HELD)
    return sorted(admitted.values_list("schedule__name", flat=True))


# -- recording ---------------------------------------------------------------------------


def test_planning_a_limited_schedule_records_its_run_held():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    schedule = limited(limit, "a", interval=timedelta(minutes=1), jitter=None)
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0)
    planner.plan_due(T0)
    run = Run.objects.get(schedule=schedule)
    assert (run.concurrency_limit_id, run.release_at, run.held_release_at) == (
        limit.pk,
        limits.HELD,
        None,
    )
    assert not Run.objects.claimable(T0 + timedelta(hours=1)).exists()


def test_a_run_of_a_schedule_without_a_limit_is_not_held():
    schedule = ScheduleFactory()
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0)
    planner.plan_due(T0)
    run = Run.objects.get(schedule=schedule)
    assert (run.concurrency_limit_id, run.release_at) == (None, None)


def test_a_run_inserted_by_code_that_knows_no_limits_is_held_by_the_database():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    schedule = limited(limit, "a")
    free = ScheduleFactory(name="free")
    fields = {"job_name": "tests.jobs.noop", "plan_time": T0}
    Run.objects.bulk_create(
        [
            Run(schedule=schedule, release_at=T0 + timedelta(seconds=5), **fields),
            Run(schedule=schedule, scope="done", status=Run.Status.SKIPPED, **fields),
            Run(schedule=free, **fields),
        ]
    )
    rows = Run.objects.order_by("pk").values_list(
        "concurrency_limit", "release_at", "held_release_at"
    )
    assert list(rows) == [
        (limit.pk, limits.HELD, T0 + timedelta(seconds=5)),
        (None, None, None),  # recorded skipped: it never starts
        (None, None, None),  # its schedule has no limit
    ]


# -- admission ---------------------------------------------------------------------------


def test_the_oldest_waiting_runs_take_the_free_slots():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=2)
    runs = [held_run(limited(limit, f"s{i}"), T0 + timedelta(seconds=10 - i)) for i in range(4)]
    assert admit(T0 + timedelta(minutes=1)).admitted == 2
    assert started(runs) == ["s2", "s3"]  # the two oldest plan times
    assert admit(T0 + timedelta(minutes=1)).admitted == 0  # no slot left
    Run.objects.filter(pk=runs[3].pk).update(status=Run.Status.SUCCEEDED)
    result = admit(T0 + timedelta(minutes=1))
    assert (result.admitted, result.full) == (1, True)
    assert started(runs) == ["s1", "s2", "s3"]


def test_a_per_scope_limit_has_slots_for_each_scope_key():
    limit = ConcurrencyLimit.objects.create(name="tenant", max_running=1, per_scope=True)
    schedule = limited(limit, "s", overlap="concurrent")
    runs = [held_run(schedule, T0, scope=scope) for scope in ("acme", "globex")]
    runs.append(held_run(schedule, T0 + timedelta(seconds=1), scope="acme"))
    assert admit(T0 + timedelta(minutes=1)).admitted == 2
    admitted = Run.objects.filter(concurrency_limit=limit).exclude(release_at=limits.HELD)
    assert sorted(admitted.values_list("scope", "plan_time")) == [("acme", T0), ("globex", T0)]


def test_a_run_is_admitted_only_once_released():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    run = held_run(limited(limit, "s"), T0, release_at=T0 + timedelta(seconds=30))
    result = admit(T0 + timedelta(seconds=29))
    assert (result.admitted, result.full, result.next_release) == (0, False, run.held_release_at)
    assert admit(T0 + timedelta(seconds=30)).admitted == 1
    run.refresh_from_db()
    assert (run.release_at, run.held_release_at) == (T0 + timedelta(seconds=30), None)


def test_a_run_waiting_past_its_start_deadline_is_skipped_naming_its_limit(received):  # noqa: F811
    limit = ConcurrencyLimit.objects.create(name="reports", max_running=1)
    holder = held_run(limited(limit, "holder"), T0)
    late = held_run(limited(limit, "late"), T0, start_deadline=T0 + timedelta(seconds=5))
    admit(T0)
    result = admit(T0 + timedelta(seconds=6))
    assert (result.admitted, result.skipped) == (0, 1)
    late.refresh_from_db()
    assert (late.status, late.error_code) == (Run.Status.SKIPPED, ErrorCode.CONCURRENCY_LIMIT)
    assert "“reports”" in late.error_message
    skipped = [arguments["run_id"] for name, _, arguments, _ in received if name == "skipped"]
    assert skipped == [late.pk]
    holder.refresh_from_db()
    assert holder.status == Run.Status.PENDING


def test_a_slot_the_sweeper_frees_wakes_the_planners_at_once(process, raw_listen):  # noqa: F811
    """A run of a dead process, failed by the sweep, frees its slot: a NOTIFY says so, and
    the planners admit the next run then rather than at their next poll."""
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    held_run(limited(limit, "dies", lease_timeout=timedelta(seconds=5)), T0)
    waiting = held_run(limited(limit, "next"), T0 + timedelta(seconds=1))
    now = T0 + timedelta(minutes=1)
    assert admit(now).admitted == 1
    assert payloads(raw_listen, 1)  # the admission's own, to the claimers
    (claim,) = claims.claim(process, now, 1)
    assert leases.mark_started([claim.token]) == {claim.token}
    assert leases.sweep(now + timedelta(seconds=6)).failed == 1
    assert payloads(raw_listen, 1)
    assert admit(now + timedelta(seconds=6)).admitted == 1
    assert started([waiting]) == ["next"]


def test_a_held_run_cancelled_gets_its_release_back():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    run = held_run(limited(limit, "s"), T0, release_at=T0 + timedelta(seconds=3))
    Run.objects.filter(pk=run.pk).cancel()
    run.refresh_from_db()
    assert (run.status, run.release_at, run.held_release_at) == (
        Run.Status.CANCELLED,
        T0 + timedelta(seconds=3),
        None,
    )


def test_a_held_run_whose_limit_was_deleted_is_admitted():
    limit = ConcurrencyLimit.objects.create(name="gone", max_running=1)
    schedule = limited(limit, "s")
    runs = [held_run(schedule, T0, scope=scope) for scope in ("a", "b")]
    Schedule.objects.filter(pk=schedule.pk).update(concurrency_limit=None)
    limit.delete()
    assert admit(T0).admitted == 2
    assert Run.objects.filter(pk__in=[r.pk for r in runs], release_at=None).count() == 2


def test_a_pass_with_no_run_waiting_is_one_statement():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    held_run(limited(limit, "s"), T0)
    admit(T0)  # admitted: nothing waits now
    with CaptureQueriesContext(connection) as queries:
        assert admit(T0) == Admission()
    statements = [q["sql"] for q in queries if not q["sql"].startswith(TRANSACTION_CONTROL)]
    assert len(statements) == 1, statements


TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")


def test_two_passes_at_once_admit_no_more_than_the_slots(postgres):
    limit = ConcurrencyLimit.objects.create(name="db", max_running=3)
    for i in range(20):
        held_run(limited(limit, f"s{i}"), T0)
    # The first pass holds the limit's lock until the barrier; the second waits for it,
    # then counts what the first admitted.
    barrier = threading.Barrier(2)
    results = []

    def pass_in_a_thread(first: bool) -> None:
        try:
            with transaction.atomic():
                if first:
                    results.append(admit(T0).admitted)
                    barrier.wait(timeout=10)
                else:
                    barrier.wait(timeout=10)
                    results.append(admit(T0).admitted)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=pass_in_a_thread, args=(i == 0,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [0, 3]
    assert Run.objects.filter(limits.HOLDING, concurrency_limit=limit).count() == 3


def test_a_handed_off_run_holds_its_slot_until_its_task_records_its_outcome(dummy):  # noqa: F811
    limit = ConcurrencyLimit.objects.create(name="one", max_running=1)
    now = clock.now() - timedelta(seconds=1)
    for name in ("first", "second"):
        schedule = limited(limit, name, job="tests.jobs.record", tasks_backend="dummy")
        held_run(schedule, now)
    assert admit(now).admitted == 1
    assert handoff.dispatch() == 1  # the admitted run only
    assert admit(now).admitted == 0  # its task has not run yet: the slot is taken
    assert deliver(dummy.results[0]) == "succeeded"
    assert admit(now).admitted == 1
    assert handoff.dispatch() == 1
    assert deliver(dummy.results[1]) == "succeeded"
    assert sorted(Execution.objects.values_list("schedule", flat=True)) == ["first", "second"]


def test_explain_says_a_fire_waits_for_its_limit():
    limit = ConcurrencyLimit.objects.create(name="warehouse", max_running=1)
    schedule = limited(limit, "s", interval=timedelta(minutes=1))
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0)
    planner.plan_due(T0)
    (account,) = Schedule.objects.get(pk=schedule.pk).explain(T0, T0 + timedelta(seconds=1))
    assert account.status == "pending"
    assert account.detail == "Waiting for a slot of its concurrency limit “warehouse”."
    admit(T0 + timedelta(seconds=45))  # within its start deadline (misfire_grace: 1 min)
    (account,) = Schedule.objects.get(pk=schedule.pk).explain(T0, T0 + timedelta(seconds=1))
    assert account.detail == "Waited 45 s for a slot of its concurrency limit “warehouse”."


# -- validation --------------------------------------------------------------------------


def test_a_limit_needs_at_least_one_slot():
    with pytest.raises(ValidationError) as caught:
        ConcurrencyLimit(name="none", max_running=0).full_clean()
    assert "max_running" in caught.value.message_dict
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        ConcurrencyLimit.objects.filter(pk=limit.pk).update(max_running=0)


def test_a_limit_that_schedules_name_cannot_be_deleted():
    limit = ConcurrencyLimit.objects.create(name="db", max_running=1)
    limited(limit, "s")
    with pytest.raises(ProtectedError):
        limit.delete()


# -- running -----------------------------------------------------------------------------


def test_run_due_runs_every_limited_run_one_slot_at_a_time(tmp_path):
    notes = tmp_path / "notes"
    limit = ConcurrencyLimit.objects.create(name="one", max_running=1)
    for i in range(3):
        held_run(
            limited(
                limit,
                f"s{i}",
                job="tests.jobs.occupy",
                kwargs={"notes": str(notes), "seconds": 0.05},
            ),
            T0,
        )
    run_due(now=T0 + timedelta(seconds=1))
    assert most_at_once(jobs_of(notes)) == 1
    assert notes.read_text().count("end ") == 3
