import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections

from django_periodic import policies
from django_periodic.db import arrays, clock
from django_periodic.engine.planning import decisions, planner
from django_periodic.models import Run, Schedule
from django_periodic.timing import bounds, triggers
from tests.factories import RunFactory, ScheduleFactory, due_row
from tests.helpers import set_cursor
from tests.threads import Thread

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY = timedelta(seconds=10)


def due_schedule(cursor=T0, **fields) -> Schedule:
    """A 10-second interval schedule anchored at T0 whose cursor is at ``cursor``."""
    fields.setdefault("interval", EVERY)
    schedule = ScheduleFactory(start_at=T0, **fields)
    set_cursor(schedule, cursor)
    schedule.refresh_from_db()
    return schedule


def runs_of(schedule) -> list[tuple[datetime, str, str]]:
    rows = Run.objects.filter(schedule=schedule).order_by("plan_time")
    return [(r.plan_time, r.status, r.error_code) for r in rows]


@pytest.mark.django_db
def test_a_due_schedule_gets_one_pending_run_and_its_cursor_advances():
    schedule = due_schedule()
    result = planner.plan_due(T0 + timedelta(seconds=1))
    schedule.refresh_from_db()
    assert result.fired == 1
    assert runs_of(schedule) == [(T0, "pending", "")]
    assert schedule.next_fire_at == T0 + EVERY


@pytest.mark.django_db
def test_planning_the_same_moment_twice_creates_no_second_run():
    schedule = due_schedule()
    planner.plan_due(T0 + timedelta(seconds=1))
    planner.plan_due(T0 + timedelta(seconds=1))
    assert len(runs_of(schedule)) == 1


@pytest.mark.django_db
def test_a_schedule_not_yet_due_is_not_touched():
    schedule = due_schedule(cursor=T0 + EVERY)
    assert planner.plan_due(T0).schedules == 0
    assert runs_of(schedule) == []


@pytest.mark.django_db
def test_a_fire_within_the_lead_is_planned_ahead_for_its_plan_time():
    schedule = due_schedule(cursor=T0 + EVERY)
    now = T0 + EVERY - timedelta(seconds=1)
    result = planner.plan_due(now, ahead=timedelta(seconds=2))
    schedule.refresh_from_db()
    assert (result.fired, result.late) == (1, 0)
    assert runs_of(schedule) == [(T0 + EVERY, "pending", "")]
    run = Run.objects.get(schedule=schedule)
    assert run.start_deadline == T0 + EVERY + schedule.misfire_grace  # from its plan time
    assert schedule.next_fire_at == T0 + 2 * EVERY  # one fire ahead, not every one in reach


@pytest.mark.django_db
def test_a_fire_within_the_lead_waits_while_a_run_is_in_flight():
    schedule = due_schedule(cursor=T0 + EVERY)
    RunFactory(schedule=schedule, plan_time=T0, status="running")
    result = planner.plan_due(T0 + EVERY - timedelta(seconds=1), ahead=timedelta(seconds=2))
    schedule.refresh_from_db()
    assert result.schedules == 0
    assert schedule.next_fire_at == T0 + EVERY  # its overlap policy decides when it is due
    assert runs_of(schedule) == [(T0, "running", "")]
    assert planner.plan_due(T0 + EVERY).skipped == 1  # due, and the run still in flight


@pytest.mark.django_db
def test_a_fire_beyond_the_lead_is_not_planned():
    schedule = due_schedule(cursor=T0 + EVERY)
    assert planner.plan_due(T0, ahead=timedelta(seconds=2)).schedules == 0
    assert runs_of(schedule) == []


@pytest.mark.django_db
def test_a_disabled_schedule_is_not_planned():
    schedule = due_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False)
    assert planner.plan_due(T0 + EVERY).schedules == 0


@pytest.mark.django_db
def test_fires_late_within_the_grace_all_run():
    schedule = due_schedule(misfire_grace=timedelta(minutes=1), overlap="concurrent")
    planner.plan_due(T0 + timedelta(seconds=25))
    assert [status for _, status, _ in runs_of(schedule)] == ["pending"] * 3


@pytest.mark.django_db
def test_misfire_latest_fires_the_most_recent_missed_time_and_records_the_others():
    schedule = due_schedule(misfire_grace=timedelta(seconds=5))
    now = T0 + timedelta(seconds=42)
    planner.plan_due(now)
    schedule.refresh_from_db()
    assert runs_of(schedule) == [
        (T0, "skipped", "missed"),
        (T0 + EVERY, "skipped", "missed"),
        (T0 + 2 * EVERY, "skipped", "missed"),
        (T0 + 3 * EVERY, "skipped", "missed"),
        (T0 + 4 * EVERY, "pending", ""),
    ]
    assert schedule.next_fire_at == T0 + 5 * EVERY


@pytest.mark.django_db
def test_misfire_skip_fires_none_of_the_missed_times():
    schedule = due_schedule(misfire="skip", misfire_grace=timedelta(seconds=5))
    planner.plan_due(T0 + timedelta(seconds=22))
    assert runs_of(schedule) == [
        (T0, "skipped", "missed"),
        (T0 + EVERY, "skipped", "missed"),
        (T0 + 2 * EVERY, "pending", ""),
    ]


@pytest.mark.django_db
def test_misfire_all_fires_every_missed_time_in_order():
    schedule = due_schedule(misfire="all", misfire_grace=timedelta(seconds=5), overlap="concurrent")
    planner.plan_due(T0 + timedelta(seconds=22))
    assert runs_of(schedule) == [(T0 + i * EVERY, "pending", "") for i in range(3)]


@pytest.mark.django_db
def test_a_long_downtime_is_bounded_by_the_catchup_limit(settings):
    settings.DJANGO_PERIODIC = {"CATCHUP_LIMIT": 5}
    schedule = due_schedule(misfire_grace=timedelta(seconds=5))
    now = T0 + timedelta(days=1, seconds=3)
    planner.plan_due(now)
    runs = runs_of(schedule)
    schedule.refresh_from_db()
    latest = T0 + timedelta(days=1)
    assert runs[:6] == [(T0 + i * EVERY, "skipped", "missed") for i in range(6)]
    assert runs[6] == (T0 + 6 * EVERY, "skipped", "missed")  # stands for the unlisted ones
    assert (
        f"up to {latest:%Y-%m-%d %H:%M:%S}" in Run.objects.get(plan_time=runs[6][0]).error_message
    )
    assert runs[7:] == [(latest, "pending", "")]
    assert schedule.next_fire_at == latest + EVERY


@pytest.mark.django_db
def test_overlap_skip_records_a_skipped_run_while_one_is_active():
    schedule = due_schedule()
    RunFactory(schedule=schedule, plan_time=T0 - EVERY, status="running")
    planner.plan_due(T0)
    assert runs_of(schedule)[-1] == (T0, "skipped", "overlap")


@pytest.mark.django_db
def test_an_unknown_overlap_value_behaves_as_skip():
    schedule = due_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(overlap="sometimes")
    RunFactory(schedule=schedule, plan_time=T0 - EVERY, status="pending")
    planner.plan_due(T0)
    assert runs_of(schedule)[-1] == (T0, "skipped", "overlap")


@pytest.mark.django_db
def test_overlap_concurrent_fires_alongside_an_active_run():
    schedule = due_schedule(overlap="concurrent")
    RunFactory(schedule=schedule, plan_time=T0 - EVERY, status="running")
    planner.plan_due(T0)
    assert runs_of(schedule)[-1] == (T0, "pending", "")


@pytest.mark.django_db
def test_overlap_queue_queues_one_and_skips_beyond():
    schedule = due_schedule(overlap="queue", misfire_grace=timedelta(minutes=5))
    RunFactory(schedule=schedule, plan_time=T0 - EVERY, status="running")
    planner.plan_due(T0 + EVERY)
    assert runs_of(schedule)[1:] == [(T0, "queued", ""), (T0 + EVERY, "skipped", "queue_full")]


@pytest.mark.django_db
def test_a_new_fire_supersedes_a_run_waiting_to_retry():
    schedule = due_schedule()
    waiting = RunFactory(schedule=schedule, plan_time=T0 - EVERY, status="retrying")
    planner.plan_due(T0)
    waiting.refresh_from_db()
    assert (waiting.status, waiting.error_code) == ("failed", "superseded")
    assert runs_of(schedule)[-1] == (T0, "pending", "")


@pytest.mark.django_db
def test_a_one_shot_fires_once_then_has_no_next_fire():
    schedule = ScheduleFactory(interval=None, run_at=T0)
    assert schedule.next_fire_at == T0
    planner.plan_due(T0 + timedelta(seconds=1))
    planner.plan_due(T0 + timedelta(days=1))
    schedule.refresh_from_db()
    assert [status for _, status, _ in runs_of(schedule)] == ["pending"]
    assert schedule.next_fire_at is None


@pytest.mark.django_db
def test_a_bad_row_is_disabled_after_repeated_failures_and_the_others_still_fire(settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 3}
    bad = due_schedule(interval=None, cron="0 3 * * *")
    Schedule.objects.filter(pk=bad.pk).update(cron="61 * * * *")
    good = due_schedule(interval=timedelta(seconds=1))
    for tick in range(1, 4):
        result = planner.plan_due(T0 + timedelta(seconds=tick))
        bad.refresh_from_db()
        assert bad.planning_failures == tick
        assert bad.enabled == (tick < 3)
    assert "minute" in bad.last_error
    assert result.disabled == [bad.name]
    assert [plan_time for plan_time, _, _ in runs_of(good)] == [
        T0 + timedelta(seconds=s) for s in range(4)
    ]


@pytest.mark.django_db
def test_a_schedule_that_plans_again_forgets_its_failures():
    schedule = due_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(job="tests.jobs.removed_from_code")
    planner.plan_due(T0 + timedelta(seconds=1))
    Schedule.objects.filter(pk=schedule.pk).update(job="tests.jobs.noop")
    planner.plan_due(T0 + timedelta(seconds=2))
    schedule.refresh_from_db()
    assert (schedule.planning_failures, schedule.last_error, schedule.enabled) == (0, "", True)
    assert [status for _, status, _ in runs_of(schedule)] == ["pending"]


@pytest.mark.parametrize("grace", [timedelta(days=999_999), timedelta.max])
def test_a_misfire_grace_past_the_range_of_times_misses_nothing(grace):
    # Once stopped both schedulers at every start: now - grace overflowed, outside any try.
    now = T0 + timedelta(seconds=42)
    row = due_row(T0, interval=EVERY, overlap="concurrent", misfire_grace=grace)
    decision = decisions.decide(row, now, policies.Occupancy())
    assert decision.error == ""
    assert [(f.plan_time, f.status) for f in decision.fires] == [
        (T0 + i * EVERY, "pending") for i in range(5)
    ]


@pytest.mark.parametrize(
    "duration",
    [timedelta.min, -timedelta(days=999_999), timedelta(0), timedelta(days=999_999), timedelta.max],
)
def test_deadlines_stay_within_the_range_of_times_whatever_the_duration(duration):
    for now in (bounds.EARLIEST, T0, bounds.LATEST - timedelta(microseconds=1)):
        assert bounds.EARLIEST <= policies.misfire_deadline(duration, now) <= bounds.LATEST
        deadline = policies.start_deadline(duration, now, now)
        assert deadline is None or bounds.EARLIEST <= deadline < bounds.LATEST


@pytest.mark.django_db
def test_a_schedule_whose_decision_raises_fails_alone_and_its_batch_is_planned(monkeypatch):
    # Whatever raises while deciding for one row (here a policy, made to) is that row's
    # failure: recorded on it, and the rest of the batch is planned in the same tick.
    # Its own grace: schedules alike in every column the decision reads share one.
    broken = due_schedule(name="broken", misfire_grace=timedelta(minutes=2))
    healthy = [due_schedule(name=f"healthy-{i}") for i in range(3)]
    overlap_status = policies.overlap_status

    def raising_for_broken(policy, occupancy):
        if policy.name == "broken":
            raise RuntimeError("a bug no row should trigger")
        return overlap_status(policy, occupancy)

    monkeypatch.setattr(policies, "overlap_status", raising_for_broken)
    result = planner.plan_due(T0 + timedelta(seconds=1))
    broken.refresh_from_db()
    assert result.failed == ["broken"] and result.fired == 3
    assert broken.last_error == "Cannot plan: RuntimeError: a bug no row should trigger"
    assert (broken.planning_failures, broken.next_fire_at) == (1, T0)
    assert runs_of(broken) == []
    for schedule in healthy:
        assert runs_of(schedule) == [(T0, "pending", "")]


@pytest.mark.django_db
def test_a_failure_count_stored_past_the_limit_does_not_overflow_its_column(settings):
    # failures + 1 overflowed PostgreSQL's integer: the whole tick failed, every time.
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 3}
    bad = due_schedule(interval=None, cron="0 3 * * *")
    Schedule.objects.filter(pk=bad.pk).update(cron="61 * * * *", planning_failures=2**31 - 1)
    good = due_schedule()
    assert planner.plan_due(T0 + timedelta(seconds=1)).disabled == [bad.name]
    bad.refresh_from_db()
    assert (bad.planning_failures, bad.enabled) == (3, False)
    assert runs_of(good) == [(T0, "pending", "")]


def unplanned(**fields) -> Schedule:
    """A schedule as bulk_create, raw SQL or a fixture store it: its cursor the database's
    default, ``bounds.UNPLANNED``."""
    schedule = ScheduleFactory(**fields)
    set_cursor(schedule, bounds.UNPLANNED)
    return schedule


@pytest.mark.django_db
def test_a_schedule_stored_without_save_starts_from_its_first_fire_time():
    now = T0 + timedelta(seconds=42)
    interval = unplanned(interval=EVERY, start_at=T0)
    cron = unplanned(interval=None, cron="*/5 * * * *")
    once = unplanned(interval=None, run_at=T0)  # passed: its misfire policy decides
    ended = unplanned(interval=None, run_at=T0, end_at=T0 - EVERY)  # never fires
    result = planner.plan_due(now)
    assert (result.schedules, result.fired, result.skipped, result.failed) == (4, 0, 0, [])
    assert not Run.objects.exists()  # no run for a time it never had
    cursors = dict(Schedule.objects.values_list("pk", "next_fire_at"))
    assert cursors == {
        interval.pk: T0 + 5 * EVERY,
        cron.pk: T0 + timedelta(minutes=5),
        once.pk: T0,
        ended.pk: None,
    }
    planner.plan_due(now)
    assert runs_of(once) == [(T0, "pending", "")]  # within its grace: fired


@pytest.mark.django_db
def test_a_schedule_stored_by_bulk_create_is_planned_from_its_trigger():
    (schedule,) = Schedule.objects.bulk_create(
        [Schedule(name="bulk", job="tests.jobs.noop", interval=EVERY, start_at=T0)]
    )
    schedule.refresh_from_db()
    assert schedule.is_unplanned  # the database's default cursor
    planner.plan_due(T0 + timedelta(seconds=42))
    schedule.refresh_from_db()
    assert (schedule.next_fire_at, runs_of(schedule)) == (T0 + 5 * EVERY, [])


@pytest.mark.django_db
def test_a_schedule_stored_without_save_with_a_bad_trigger_fails_planning():
    bad = unplanned(interval=None, cron="0 3 * * *")
    Schedule.objects.filter(pk=bad.pk).update(cron="61 * * * *")
    assert planner.plan_due(T0).failed == [bad.name]
    bad.refresh_from_db()
    assert (bad.planning_failures, bad.next_fire_at) == (1, bounds.UNPLANNED)
    assert "minute" in bad.last_error


def queries_to_plan(count: int, make_schedule, at) -> list[str]:
    """The statements planning ``count`` schedules made by ``make_schedule()`` costs at ``at``."""
    for _ in range(count):
        make_schedule()
    queries = []

    def counter(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counter):
        assert planner.plan_due(at).schedules == count
    Schedule.objects.all().delete()
    return queries


@pytest.mark.django_db
def test_planning_schedules_stored_without_save_costs_a_constant_number_of_queries(postgres):
    def make():
        unplanned(interval=EVERY, start_at=T0)

    assert len(queries_to_plan(60, make, T0)) == len(queries_to_plan(5, make, T0))


@pytest.mark.django_db
def test_planning_costs_a_constant_number_of_queries(postgres):
    # SQLite caps query parameters at 999, so Django splits its bulk statements there.
    at = T0 + timedelta(seconds=1)
    few = len(queries_to_plan(5, due_schedule, at))
    assert len(queries_to_plan(60, due_schedule, at)) == few
    assert few <= 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_planners_never_fire_a_plan_time_twice(postgres):
    schedules = [due_schedule(overlap="concurrent", misfire="all") for _ in range(50)]
    barrier = threading.Barrier(4)
    now = T0 + timedelta(seconds=55)

    def plan():
        try:
            barrier.wait()
            while planner.plan_due(now, batch_size=7).schedules:
                pass
        finally:
            connections.close_all()

    threads = [Thread(target=plan) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for schedule in schedules:
        plan_times = [plan_time for plan_time, _, _ in runs_of(schedule)]
        assert plan_times == [T0 + i * EVERY for i in range(6)]


@pytest.mark.django_db
def test_run_now_records_a_pending_manual_run():
    schedule = ScheduleFactory()
    before = clock.now()
    run = schedule.run_now()
    assert (run.trigger, run.status, run.schedule_id) == ("manual", "pending", schedule.pk)
    assert before <= run.plan_time <= clock.now()


@pytest.mark.django_db
def test_schedules_sharing_a_trigger_compute_their_next_fire_once(monkeypatch):
    calls = []
    next_after = triggers.CronTrigger.next_after

    def counted(self, after):
        calls.append(after)
        return next_after(self, after)

    cursor = datetime(2026, 1, 1, 12, tzinfo=UTC)
    now = cursor + timedelta(seconds=30)
    for i in range(50):
        schedule = ScheduleFactory(name=f"shared-{i}", cron="*/5 * * * *", interval=None)
        set_cursor(schedule, cursor)
    # What each would compute alone, without the batch's memo.
    expected = {}
    for schedule in Schedule.objects.all():
        alone = decisions._due_times(schedule.trigger, schedule.next_fire_at, now, 100)
        expected[schedule.pk] = (alone.cursor, alone.times)
    monkeypatch.setattr(triggers.CronTrigger, "next_after", counted)
    result = planner.plan_due(now, batch_size=100)
    assert result.schedules == 50 and result.fired == 50
    assert len(calls) == 1
    for schedule in Schedule.objects.all():
        cursor_after, times = expected[schedule.pk]
        assert schedule.next_fire_at == cursor_after
        assert [plan_time for plan_time, _, _ in runs_of(schedule)] == times


def mixed_batch() -> None:
    """Schedules that decide differently at T0 + 42 s: cursors, fires, policies, in flight."""
    due_schedule(name="on-time")
    due_schedule(name="on-time-too")  # decides exactly as on-time
    due_schedule(name="later-cursor", cursor=T0 + 3 * EVERY)
    due_schedule(name="latest", misfire_grace=timedelta(seconds=5), args=[1], kwargs={"a": 2})
    due_schedule(name="skip", misfire="skip", misfire_grace=timedelta(seconds=5))
    due_schedule(name="all", misfire="all", overlap="concurrent", max_attempts=3)
    due_schedule(name="other-grace", misfire_grace=timedelta(minutes=7), overlap="concurrent")
    busy = due_schedule(name="busy", overlap="queue", misfire_grace=timedelta(minutes=5))
    RunFactory(schedule=busy, plan_time=T0 - EVERY, status="running")
    retried = due_schedule(name="retried", cursor=T0 + 4 * EVERY)
    RunFactory(schedule=retried, plan_time=T0, status="retrying")
    due_schedule(name="once", cursor=T0 + EVERY, interval=None, run_at=T0 + EVERY)


def planned(batch_size: int) -> dict[str, tuple]:
    mixed_batch()
    while planner.plan_due(T0 + timedelta(seconds=42), batch_size=batch_size).schedules:
        pass
    columns = (
        "plan_time", "status", "error_code", "error_message", "exclusive", "start_deadline",
        "finished_at", "job_name", "args", "kwargs", "max_attempts", "attempt",
    )  # fmt: skip
    outcome = {}
    for schedule in Schedule.objects.all():
        runs = schedule.runs.filter(trigger="schedule").order_by("plan_time")
        outcome[schedule.name] = (schedule.next_fire_at, list(runs.values_list(*columns)))
    Schedule.objects.all().delete()
    return outcome


@pytest.mark.django_db
def test_a_batch_records_for_each_schedule_what_it_decided_alone():
    together, alone = planned(batch_size=100), planned(batch_size=1)
    assert together == alone
    assert together["latest"][1][-1][:3] == (T0 + 4 * EVERY, "pending", "")
    assert [run[1] for run in together["busy"][1]] == ["running", "queued"] + ["skipped"] * 4
    assert together["once"][0] is None and len(together["all"][1]) == 5


def test_array_literals_quote_what_postgresql_would_misread():
    assert arrays.literal([1, None, True]) == "{1,NULL,t}"
    assert arrays.literal(['a "b"', "c\\d", ""]) == '{"a \\"b\\"","c\\\\d",""}'
    assert arrays.literal([T0]) == "{2026-01-01T00:00:00+00:00}"
