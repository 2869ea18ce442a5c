"""A schedule pauses itself at the outcome of the failure that makes its streak reach
``pause_after_failures``, in that outcome's transaction; its fires not started yet are
withdrawn; a failure no outcome recorded, or a schedule row locked at the outcome, is left
to the attention pass. The rule itself (what a streak is) is tested in test_lifecycle.py.
"""

import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_periodic import signals
from django_periodic.choices import ErrorCode, RunStatus, RunTrigger
from django_periodic.db import clock
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import attention
from django_periodic.engine.records import Failure
from django_periodic.engine.runs import claims, outcomes
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess, pausing
from tests.factories import RunFactory, ScheduleFactory
from tests.models import Execution
from tests.processes import run_until_it_pauses_itself

SECOND = timedelta(seconds=1)


@pytest.fixture
def paused_signals():
    """The names of the schedules ``schedule_paused`` was sent for."""
    sent = []

    def receiver(sender, schedule, **kwargs):
        sent.append(schedule)

    signals.schedule_paused.connect(receiver)
    yield sent
    signals.schedule_paused.disconnect(receiver)


def pausing_after(failures: int | None, **fields: object) -> Schedule:
    """A schedule with ``pause_after_failures``, whose runs may be active at once."""
    overlap = Schedule.Overlap.CONCURRENT
    return ScheduleFactory(pause_after_failures=failures, overlap=overlap, **fields)


def run_of(schedule: Schedule, **fields: object) -> Run:
    """A run of ``schedule`` that does not hold its one active slot (its runs overlap)."""
    return RunFactory(schedule=schedule, exclusive=False, **fields)


def failures_of(
    process: SchedulerProcess, schedule: Schedule, count: int, at: datetime
) -> list[outcomes.AttemptOutcome]:
    """The outcomes of ``count`` runs of ``schedule`` planned a second apart from ``at``,
    claimed and failed (not recorded yet)."""
    for n in range(count):
        run_of(schedule, plan_time=at + n * SECOND)
    claimed = claims.claim(process, at + count * SECOND, count)
    assert len(claimed) == count
    return [outcomes.failed(claim, Failure("boom", "it broke")) for claim in claimed]


def fail(process: SchedulerProcess, schedule: Schedule, count: int, at: datetime) -> None:
    """Record ``count`` failed runs of ``schedule``, a second apart from ``at``, one
    outcome at a time."""
    for n in range(count):
        (outcome,) = failures_of(process, schedule, 1, at + n * SECOND)
        outcomes.record([outcome], at + n * SECOND)


def is_paused(schedule: Schedule) -> bool:
    schedule.refresh_from_db()
    return schedule.paused_by == "scheduler" and schedule.paused_until == pausing.UNTIL_RESUMED


def later() -> datetime:
    """A time after the last save of every schedule made so far (streaks count from it)."""
    return clock.now()


@pytest.mark.django_db(transaction=True)
def test_the_nth_failure_pauses_its_schedule_in_its_outcomes_transaction(process, paused_signals):
    schedule = pausing_after(3)
    at = later()
    fail(process, schedule, 2, at)
    assert not is_paused(schedule)
    (third,) = failures_of(process, schedule, 1, at + 2 * SECOND)
    with transaction.atomic():
        outcomes.record([third], at + 2 * SECOND)
        assert is_paused(schedule)  # before the commit: in the outcome's transaction
        assert paused_signals == []  # announced once committed
    assert paused_signals == [schedule.name]
    failed = Run.objects.filter(schedule=schedule, status=RunStatus.FAILED)
    assert schedule.pause_reason.startswith("3 failed runs in a row (pause_after_failures 3)")
    for pk in failed.values_list("pk", flat=True):
        assert f"run {pk} planned" in schedule.pause_reason
    version = schedule.versions.first()
    assert (version.by, version.changes["paused_by"]) == ("scheduler", ["", "scheduler"])


@pytest.mark.django_db(transaction=True)
def test_a_failure_rolled_back_pauses_nothing(process):
    schedule = pausing_after(1)
    (outcome,) = failures_of(process, schedule, 1, later())
    with pytest.raises(RuntimeError), transaction.atomic():
        outcomes.record([outcome])
        assert is_paused(schedule)
        raise RuntimeError("the outcome's transaction rolls back")
    assert not is_paused(schedule)


@pytest.mark.django_db
def test_a_batch_pauses_its_schedule_at_the_nth_failure_it_holds(process):
    schedule = pausing_after(3)
    other = pausing_after(3)
    at = later()
    batch = failures_of(process, schedule, 3, at)
    (one,) = failures_of(process, other, 1, at)
    outcomes.record([*batch, one])
    assert is_paused(schedule) and not is_paused(other)


@pytest.mark.django_db
def test_a_success_resets_the_streak(process):
    schedule = pausing_after(2)
    at = later()
    fail(process, schedule, 1, at)
    run_of(schedule, plan_time=at + SECOND)
    (success,) = claims.claim(process, at + SECOND, 1)
    outcomes.record([outcomes.succeeded(success, None)])
    fail(process, schedule, 1, at + 2 * SECOND)
    assert not is_paused(schedule)
    fail(process, schedule, 1, at + 3 * SECOND)
    assert is_paused(schedule)


@pytest.mark.django_db
def test_a_resumed_or_edited_schedule_counts_its_failures_afresh(process):
    schedule = pausing_after(2)
    an_hour_ago = clock.now() - timedelta(hours=1)
    Schedule.objects.filter(pk=schedule.pk).update(updated_at=an_hour_ago)
    fail(process, schedule, 2, an_hour_ago + SECOND)
    assert is_paused(schedule)
    schedule.resume()
    fail(process, schedule, 1, later())
    assert not is_paused(schedule)
    schedule.refresh_from_db()
    schedule.timeout = timedelta(minutes=5)
    schedule.save()
    fail(process, schedule, 1, later())
    assert not is_paused(schedule)  # one failure since the edit
    fail(process, schedule, 1, later())
    assert is_paused(schedule)


@pytest.mark.django_db
def test_a_failure_to_be_retried_is_no_failure_of_the_streak(process):
    schedule = pausing_after(1, max_attempts=2)
    (outcome,) = failures_of(process, schedule, 1, later())
    assert outcome.status == RunStatus.RETRYING
    outcomes.record([outcome])
    assert not is_paused(schedule)


def queries_to_record(batch: list[outcomes.AttemptOutcome]) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert len(outcomes.record(batch)) == len(batch)
    return len(captured)


@pytest.mark.django_db
def test_failures_of_schedules_without_the_setting_cost_no_query_more(process):
    at = later()
    succeeded = [
        outcomes.succeeded(claim, None)
        for claim in (failures_of(process, ScheduleFactory(), 1, at)[0].claim for _ in range(5))
    ]
    failed = [failures_of(process, ScheduleFactory(), 1, at)[0] for _ in range(5)]
    assert queries_to_record(failed) == queries_to_record(succeeded)


def extra_queries(process: SchedulerProcess, failures: int | None, batch: int) -> int:
    """The queries that recording a batch of failed runs of schedules with
    ``pause_after_failures`` costs beyond the same batch of schedules without it."""
    judging = [pausing_after(failures) for _ in range(batch)]
    plain = [pausing_after(None) for _ in range(batch)]
    at = later()  # after they were saved: their streaks count from it
    judged = [failures_of(process, schedule, 1, at)[0] for schedule in judging]
    unjudged = [failures_of(process, schedule, 1, at)[0] for schedule in plain]
    return queries_to_record(judged) - queries_to_record(unjudged)


@pytest.mark.django_db
def test_failures_of_schedules_with_the_setting_cost_a_few_queries_per_batch(process):
    # A savepoint, the streaks' query and the savepoint's release, however many.
    assert extra_queries(process, 9, 1) == extra_queries(process, 9, 8) == 3
    # And when they pause: the lock, the runs named, the version, the fires withdrawn.
    pausing_many = extra_queries(process, 1, 8)
    assert extra_queries(process, 1, 1) == pausing_many <= 15
    assert Schedule.objects.filter(paused_by="scheduler").count() == 9


@pytest.mark.django_db(transaction=True)
def test_runs_not_started_when_it_pauses_never_start(process):
    schedule = pausing_after(1)
    at = later()
    (failure,) = failures_of(process, schedule, 1, at)
    ahead = run_of(schedule, plan_time=at + SECOND)
    (held,) = claims.claim(process, at, 1, ahead=2 * SECOND)  # held for its plan time
    waiting = run_of(schedule, plan_time=at + 2 * SECOND)
    queued = run_of(schedule, plan_time=at + 3 * SECOND, status=RunStatus.QUEUED)
    by_hand = run_of(schedule, plan_time=at, trigger=RunTrigger.MANUAL)
    outcomes.record([failure], at)
    assert is_paused(schedule)
    for run in (ahead, waiting, queued):
        run.refresh_from_db()
        assert (run.status, run.error_code) == (RunStatus.SKIPPED, ErrorCode.PAUSED)
        assert run.error_message.startswith("Paused until resumed by scheduler: 1 failed run")
        assert run.started_at is None and run.finished_at is not None
    assert ledger("default").mark_started([held.token]) == set()  # its job is not called
    assert Lease.objects.get(token=held.token).outcome == Lease.Outcome.SKIPPED
    (left,) = claims.claim(process, at + 5 * SECOND, 10)
    assert left.values.pk == by_hand.pk  # a run started by hand is left to run


@pytest.mark.django_db(transaction=True)
def test_a_run_already_marked_started_is_left_to_finish(process):
    schedule = pausing_after(1)
    at = later()
    (failure,) = failures_of(process, schedule, 1, at)
    run_of(schedule, plan_time=at + SECOND)
    (running,) = claims.claim(process, at + SECOND, 1)
    assert ledger("default").mark_started([running.token]) == {running.token}
    outcomes.record([failure], at)
    assert is_paused(schedule)
    assert Run.objects.get(pk=running.values.pk).status == RunStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_failure_recorded_without_an_outcome_is_paused_by_the_attention_pass():
    schedule = pausing_after(1)
    at = later()
    run_of(schedule, plan_time=at, status=RunStatus.FAILED)  # lease expired, say
    assert not is_paused(schedule)
    (paused,) = attention.evaluate(at).paused
    assert paused.schedule_id == schedule.pk and is_paused(schedule)


@pytest.fixture
def pauses_refused():
    """The database refuses every pause the scheduler writes, as a bug or a constraint
    would; the trigger is dropped after."""
    table = connection.ops.quote_name(Schedule._meta.db_table)
    condition = "NEW.paused_by = 'scheduler'"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION periodic_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF {condition} THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER periodic_test_refuse BEFORE UPDATE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION periodic_test_refuse()"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER periodic_test_refuse BEFORE UPDATE ON {table} FOR EACH ROW"
                f" WHEN {condition} BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER periodic_test_refuse ON {table}")
            cursor.execute("DROP FUNCTION periodic_test_refuse()")
        else:
            cursor.execute("DROP TRIGGER periodic_test_refuse")


@pytest.mark.django_db(transaction=True)
def test_a_pause_the_database_refuses_loses_no_outcome(process, pauses_refused):
    schedule = pausing_after(1)
    (outcome,) = failures_of(process, schedule, 1, later())
    assert outcomes.record([outcome]) == {outcome.claim.values.pk}
    run = Run.objects.get(pk=outcome.claim.values.pk)
    assert (run.status, run.error_code) == (RunStatus.FAILED, "boom")  # as the job failed
    assert not is_paused(schedule)  # left to the next failure, or the attention pass


@pytest.fixture
def locked_schedule(postgres):
    """``lock(schedule)``: another session holds ``schedule``'s row, as a planner does,
    until the test ends or calls ``release()``."""
    holding, done = threading.Event(), threading.Event()
    threads = []

    def hold(pk: int) -> None:
        try:
            with transaction.atomic():
                list(Schedule.objects.select_for_update().filter(pk=pk))
                holding.set()
                done.wait(30)
        finally:
            connections.close_all()

    class Lock:
        def __call__(self, schedule: Schedule) -> None:
            thread = threading.Thread(target=hold, args=(schedule.pk,))
            thread.start()
            threads.append(thread)
            assert holding.wait(10)

        def release(self) -> None:
            done.set()
            for thread in threads:
                thread.join(10)

    lock = Lock()
    yield lock
    lock.release()


@pytest.mark.django_db(transaction=True)
def test_a_locked_schedule_does_not_hold_up_the_outcome_and_pauses_later(process, locked_schedule):
    schedule = pausing_after(2)
    at = later()
    fail(process, schedule, 1, at)
    (second,) = failures_of(process, schedule, 1, at + SECOND)
    locked_schedule(schedule)
    started = time.monotonic()
    assert outcomes.record([second], at + SECOND) == {second.claim.values.pk}
    assert time.monotonic() - started < 5  # the lock is held for 30 s: not waited for
    assert not is_paused(schedule)
    locked_schedule.release()
    (paused,) = attention.evaluate(clock.now()).paused
    assert paused.schedule_id == schedule.pk and is_paused(schedule)


@pytest.mark.django_db(transaction=True)
def test_the_next_failure_pauses_a_schedule_locked_at_the_nth(process, locked_schedule):
    schedule = pausing_after(1)
    at = later()
    (first,) = failures_of(process, schedule, 1, at)
    locked_schedule(schedule)
    outcomes.record([first], at)
    assert not is_paused(schedule)
    locked_schedule.release()
    fail(process, schedule, 1, at + SECOND)
    assert is_paused(schedule)
    assert "2 failed runs in a row" in schedule.pause_reason


# a real scheduler


@pytest.mark.processes
def test_a_running_scheduler_pauses_at_the_third_failure_and_starts_no_more(postgres, children):
    # The attention pass once a day: only the outcomes can pause it within the test.
    seen = run_until_it_pauses_itself(
        children.start, workers=1, ticks=4, settings={"ALERT_INTERVAL": 86400}
    )
    failing, ticking = seen.failing, seen.ticking
    # Exactly three. While a run of a schedule that skips overlaps is active, no planner
    # locks or plans its next fire before that fire is due (planner._without_waiting), and
    # the pass that could lock it sees two failures until the third's outcome commits: so
    # that outcome, a second before the fourth fire is due, finds its row free and pauses
    # it, and the fourth fire is then planned skipped (paused). Had it been planned or
    # claimed ahead, the pause would have withdrawn it (test_runs_not_started_...).
    calls = Execution.objects.filter(schedule="failing")
    assert calls.count() == 3
    runs = Run.objects.filter(schedule=failing)
    assert runs.filter(status=RunStatus.FAILED).count() == 3
    assert not runs.exclude(status__in=(RunStatus.FAILED, RunStatus.SKIPPED)).exists()
    later_fires = runs.filter(plan_time__gt=max(calls.values_list("plan_time", flat=True)))
    assert set(later_fires.values_list("error_code", flat=True)) <= {ErrorCode.PAUSED}
    assert ticking.runs.filter(status=RunStatus.SUCCEEDED).count() >= 4
    assert "Schedule 'failing' paused itself until resumed" in seen.child.output()
