"""Single-fire overrides: one fire skipped (one skipped run, code ``overridden``, saying who
and why) or moved (run once at its new time, keyed by its plan time), planned as such, or
applied at once to a planned run that has not started; refused for anything else."""

import threading
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import urlencode

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections, transaction

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import decisions, planner
from django_periodic.engine.runs import claims
from django_periodic.models import FireOverride, Run, Schedule, SchedulerProcess
from django_periodic.policies import Occupancy
from django_periodic.timing import overridden, triggers
from django_periodic.timing.overridden import OverriddenTrigger, Override
from tests.factories import ScheduleFactory, SchedulerProcessFactory, due_row
from tests.models import Execution
from tests.processes import wait_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# Out of the range of times, each by converting it to UTC: the first day after, the last
# before.
LAST_SECOND = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-5)))
FIRST_DAY = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)

pytestmark = pytest.mark.django_db(transaction=True)


def hourly(**fields) -> tuple[Schedule, datetime]:
    """A schedule firing every hour on the hour, from the next hour after the database's
    clock on; its first fire. Its runs overlap, so that each fire planned is pending."""
    first = clock.now().replace(minute=0, second=0, microsecond=0) + HOUR
    fields = {"overlap": Schedule.Overlap.CONCURRENT, **fields}
    schedule = ScheduleFactory(interval=HOUR, start_at=first, **fields)
    return schedule, first


def runs_of(schedule: Schedule) -> list[tuple[datetime, str, str, datetime | None]]:
    rows = Run.objects.filter(schedule=schedule).order_by("plan_time")
    return list(rows.values_list("plan_time", "status", "error_code", "release_at"))


# -- deciding, without the database ----------------------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_a_skipped_fire_is_one_skipped_run_with_its_own_code_and_message():
    row = due_row(T0, overrides=(Override(T0, None, "Skipped by an override by ops: freeze"),))
    decision = decisions.decide(row, T0, Occupancy())
    (fire,) = decision.fires
    assert (fire.plan_time, fire.status, fire.error_code) == (T0, "skipped", "overridden")
    assert fire.error_message == "Skipped by an override by ops: freeze"
    assert decision.cursor == T0 + MINUTE


@pytest.mark.django_db(transaction=False)
def test_the_cursor_walks_a_moved_fire_at_its_new_time_keyed_by_its_plan_time():
    moved = T0 + MINUTE
    row = due_row(T0, overrides=(Override(moved, moved + timedelta(seconds=30)),))
    first = decisions.decide(row, T0, Occupancy())
    assert first.cursor == moved + timedelta(seconds=30)  # not the fire's own time
    row.next_fire_at = first.cursor
    (fire,) = decisions.decide(row, first.cursor, Occupancy()).fires
    assert (fire.plan_time, fire.status, fire.release_at) == (moved, "pending", first.cursor)


@pytest.mark.django_db(transaction=False)
def test_schedules_alike_but_for_their_overrides_do_not_share_a_decision():
    plain = due_row(T0, pk=1)
    skipping = due_row(T0, pk=2, overrides=(Override(T0, None, "skipped"),))
    found = decisions.decide_all([plain, skipping], T0, {})
    assert [[fire.status for fire in d.fires] for d in found] == [["pending"], ["skipped"]]


@pytest.mark.django_db(transaction=False)
def test_each_scope_of_a_fanned_out_schedule_runs_a_moved_fire_at_its_new_time():
    to = T0 + timedelta(seconds=20)
    row = due_row(T0, next_fire_at=to, scopes="tests.jobs.tenants", overrides=(Override(T0, to),))
    decision = decisions.decide_fanned_out(row, to, ["a", "b"], {})
    assert [(f.scope, f.plan_time, f.release_at) for f in decision.fires] == [
        ("a", T0, to),
        ("b", T0, to),
    ]


@pytest.mark.django_db(transaction=False)
def test_the_effective_times_walk_in_order_and_map_back_to_their_fires():
    inner = triggers.IntervalTrigger(MINUTE, T0)
    overrides = (
        Override(T0 + MINUTE, None, "skipped"),
        Override(T0 + 2 * MINUTE, T0 + 2 * MINUTE + timedelta(seconds=50)),  # later
        Override(T0 + 4 * MINUTE, T0 + 3 * MINUTE + timedelta(seconds=10)),  # earlier
        Override(T0 + timedelta(seconds=30), None, "not a fire: ignored"),
    )
    trigger = OverriddenTrigger(inner, overrides)
    walked = triggers.fire_times(trigger, 5, T0 - timedelta(seconds=1))
    assert [t - T0 for t in walked] == [
        timedelta(0),
        MINUTE,
        timedelta(minutes=2, seconds=50),
        timedelta(minutes=3),
        timedelta(minutes=3, seconds=10),
    ]
    assert trigger.latest_at_or_before(T0 + 4 * MINUTE) == T0 + 3 * MINUTE + timedelta(seconds=10)
    assert trigger.latest_at_or_before(T0 + 2 * MINUTE + timedelta(seconds=1)) == T0 + MINUTE
    assert [overridden.plan_time_of(trigger, t)[0] - T0 for t in walked] == [
        timedelta(0),
        MINUTE,
        2 * MINUTE,
        3 * MINUTE,
        4 * MINUTE,
    ]


# -- validation ------------------------------------------------------------------------------


def test_a_time_that_is_not_a_fire_is_refused_naming_the_next_fires():
    schedule, first = hourly(name="reports")
    with pytest.raises(ValidationError) as refused:
        schedule.skip_fire(first + timedelta(minutes=5), "maintenance")
    message = refused.value.message_dict["plan_time"][0]
    assert "is not a fire of 'reports'" in message
    assert f"{first:%Y-%m-%d %H:%M:%S} UTC" in message


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (HOUR, "before the fire after it"),  # onto the next fire
        (-HOUR, "after the fire before it"),  # onto the previous fire
        (timedelta(0), "other than the fire's own"),
    ],
)
def test_a_move_stays_between_its_neighbours(offset, error):
    schedule, first = hourly()
    with pytest.raises(ValidationError) as refused:
        schedule.move_fire(first + HOUR, first + HOUR + offset, "later")
    assert error in refused.value.message_dict["move_to"][0]


def test_a_move_into_the_past_or_an_override_without_a_reason_is_refused():
    schedule = ScheduleFactory(interval=MINUTE, start_at=clock.now() - HOUR)
    fire = schedule.next_fire_at
    with pytest.raises(ValidationError) as refused:
        schedule.move_fire(fire, fire - timedelta(minutes=2), "earlier")
    assert "into the future" in refused.value.message_dict["move_to"][0]
    with pytest.raises(ValidationError) as refused:
        schedule.skip_fire(fire, "  ")
    assert "reason" in refused.value.message_dict
    assert not schedule.overrides.exists()


def test_a_time_out_of_the_range_of_times_is_refused_on_its_field():
    schedule, first = hourly()
    override = FireOverride(schedule=schedule, plan_time=LAST_SECOND, action="skip", reason="x")
    with pytest.raises(ValidationError) as refused:
        override.full_clean()
    assert refused.value.message_dict["plan_time"] == [
        "plan_time must be before 9000-01-01 00:00 UTC."
    ]
    refusals = [
        (lambda: schedule.skip_fire(LAST_SECOND, "end of days"), "plan_time"),
        (lambda: schedule.skip_fire(FIRST_DAY, "start of days"), "plan_time"),
        (lambda: schedule.move_fire(first, LAST_SECOND, "much later"), "move_to"),
        (lambda: schedule.clear_override(LAST_SECOND), "plan_time"),
    ]
    for call, name in refusals:
        with pytest.raises(ValidationError) as refused:
            call()
        assert list(refused.value.message_dict) == [name]
    assert not schedule.overrides.exists()


def test_a_second_override_of_one_fire_is_refused():
    schedule, first = hourly()
    schedule.skip_fire(first, "holiday")
    with pytest.raises(ValidationError, match="override already"):
        schedule.move_fire(first, first + MINUTE, "after all")


def test_a_past_fire_that_was_never_planned_is_refused():
    schedule, first = hourly()
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=first + 2 * HOUR)
    schedule.refresh_from_db()
    with pytest.raises(ValidationError, match="past and was never planned"):
        schedule.skip_fire(first, "too late")


# -- planning --------------------------------------------------------------------------------


def test_a_skipped_fire_is_planned_as_one_skipped_run_and_the_next_one_runs():
    schedule, first = hourly()
    schedule.skip_fire(first, "bank holiday", by="ops")
    planner.plan_due(first)
    planner.plan_due(first + HOUR)
    (skipped, ran) = Run.objects.filter(schedule=schedule).order_by("plan_time")
    assert (skipped.plan_time, skipped.status, skipped.error_code) == (
        first,
        "skipped",
        ErrorCode.OVERRIDDEN,
    )
    assert skipped.error_message == "Skipped by an override by ops: bank holiday"
    assert (ran.plan_time, ran.status) == (first + HOUR, "pending")


def test_a_fire_moved_later_is_planned_once_at_its_new_time_keyed_by_its_plan_time():
    schedule, first = hourly()
    to = first + timedelta(minutes=20)
    schedule.move_fire(first, to, "after the backup")
    planner.plan_due(first)
    assert runs_of(schedule) == []  # not at its own time
    planner.plan_due(to)
    planner.plan_due(first + HOUR)
    planner.plan_due(first + HOUR)
    assert runs_of(schedule) == [
        (first, "pending", "", to),
        (first + HOUR, "pending", "", None),
    ]
    moved = Run.objects.get(schedule=schedule, plan_time=first)
    assert moved.start_deadline == to + schedule.misfire_grace  # counted from its new time


def test_a_fire_moved_earlier_moves_the_cursor_and_is_planned_in_time():
    schedule, first = hourly()
    to = first + HOUR - timedelta(minutes=20)
    schedule.move_fire(first + HOUR, to, "before the audit")
    planner.plan_due(first)
    schedule.refresh_from_db()
    assert schedule.next_fire_at == to
    planner.plan_due(to)
    planner.plan_due(first + HOUR)
    assert runs_of(schedule) == [
        (first, "pending", "", None),
        (first + HOUR, "pending", "", to),
    ]


def test_moving_the_next_fire_earlier_moves_the_cursor_of_the_instance_too():
    first = clock.now() + HOUR
    schedule = ScheduleFactory(interval=HOUR, start_at=first)
    to = first - 30 * MINUTE
    schedule.move_fire(first, to, "half an hour earlier")
    assert schedule.next_fire_at == to
    schedule.refresh_from_db()
    assert schedule.next_fire_at == to


def test_a_cursor_left_at_a_moved_fire_by_a_save_walks_to_its_new_time():
    schedule, first = hourly()
    to = first + timedelta(minutes=20)
    schedule.move_fire(first, to, "after the backup")
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=first)  # as a save sets it
    planner.plan_due(first)
    assert runs_of(schedule) == []
    planner.plan_due(to)
    assert runs_of(schedule) == [(first, "pending", "", to)]


def test_clearing_an_override_before_its_fire_is_planned_restores_it():
    schedule, first = hourly()
    schedule.move_fire(first + HOUR, first + 30 * MINUTE, "before the audit")
    schedule.skip_fire(first, "holiday")
    schedule.clear_override(first + HOUR)
    schedule.clear_override(first)
    planner.plan_due(first + 30 * MINUTE)
    planner.plan_due(first + HOUR)
    assert [row[:2] for row in runs_of(schedule)] == [
        (first, "pending"),
        (first + HOUR, "pending"),
    ]
    assert not schedule.overrides.exists()


def test_an_override_whose_fire_was_planned_stays():
    schedule, first = hourly()
    schedule.skip_fire(first, "holiday")
    planner.plan_due(first)
    with pytest.raises(ValidationError, match="it stays"):
        schedule.clear_override(first)
    assert schedule.overrides.count() == 1


# -- a fire already planned ------------------------------------------------------------------


def planned_ahead() -> tuple[Schedule, Run]:
    """A schedule whose first fire is planned (pending) and has not started."""
    schedule, first = hourly()
    planner.plan_due(first - MINUTE, ahead=2 * MINUTE)
    (run,) = Run.objects.filter(schedule=schedule)
    assert (run.plan_time, run.status) == (first, "pending")
    schedule.refresh_from_db()
    return schedule, run


def test_skipping_a_planned_run_that_has_not_started_skips_it_at_once():
    schedule, run = planned_ahead()
    schedule.skip_fire(run.plan_time, "holiday", by="ops")
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("skipped", ErrorCode.OVERRIDDEN)
    assert run.error_message == "Skipped by an override by ops: holiday"
    assert run.finished_at is not None


def test_moving_a_planned_run_that_has_not_started_changes_its_release():
    schedule, run = planned_ahead()
    to = run.plan_time + 10 * MINUTE
    schedule.move_fire(run.plan_time, to, "later")
    run.refresh_from_db()
    assert (run.status, run.release_at, run.plan_time) == ("pending", to, run.plan_time)
    assert run.start_deadline == to + schedule.misfire_grace
    assert Run.objects.filter(schedule=schedule).count() == 1


@pytest.mark.parametrize("status", ["running", "succeeded", "failed"])
def test_a_fire_whose_run_started_or_ended_is_refused(status):
    schedule, run = planned_ahead()
    Run.objects.filter(pk=run.pk).update(status=status, attempt=1)
    with pytest.raises(ValidationError, match="it cannot be overridden"):
        schedule.skip_fire(run.plan_time, "too late")
    assert not schedule.overrides.exists()
    run.refresh_from_db()
    assert run.status == status


# -- a worker claiming the run meanwhile (PostgreSQL, two connections) ------------------------


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def on_thread(work) -> tuple[threading.Thread, list]:
    """Run ``work`` on a thread of its own (its own connection); its result or exception
    goes to the list returned."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def due_run() -> tuple[Schedule, Run, SchedulerProcess]:
    schedule = ScheduleFactory(interval=HOUR, start_at=clock.now() + HOUR)
    run = Run.objects.create(
        schedule=schedule, plan_time=schedule.next_fire_at, job_name=schedule.job,
        release_at=clock.now() - MINUTE,
    )  # fmt: skip
    return schedule, run, SchedulerProcessFactory()


def test_a_claim_that_commits_first_keeps_the_run_and_the_skip_is_refused(postgres):
    schedule, run, process = due_run()
    with transaction.atomic():
        assert len(claims.claim(process, None, 1)) == 1
        skipping, outcome = on_thread(lambda: schedule.skip_fire(run.plan_time, "race"))
        wait_for(waiting_for_a_lock, 10, "the skip to wait for the claim")
    skipping.join(30)
    assert isinstance(outcome[0], ValidationError)
    run.refresh_from_db()
    assert (run.status, run.attempt) == ("running", 1)
    assert not schedule.overrides.exists()


def test_a_skip_that_commits_first_leaves_the_claim_nothing(postgres):
    schedule, run, process = due_run()
    with transaction.atomic():
        schedule.skip_fire(run.plan_time, "race")
        claiming, outcome = on_thread(lambda: claims.claim(process, None, 1))
        claiming.join(30)  # the row is locked: the claim skips it rather than wait
    assert outcome == [[]]
    assert claims.claim(process, None, 1) == []
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("skipped", ErrorCode.OVERRIDDEN)


# -- a running scheduler ---------------------------------------------------------------------


@pytest.mark.processes
def test_a_running_scheduler_runs_a_moved_fire_once_at_its_new_time_and_not_a_skipped_one(
    children, postgres
):
    """A real run_scheduler: a job that writes a row for each run, every 4 seconds. One
    fire is skipped, the next moved 2 seconds later: no row at the skipped fire, one row
    for the moved one, written at or after its new time, and the fires after run as usual."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=8)
    step = timedelta(seconds=4)
    # A loaded machine may plan late or run long: every missed fire still fires, and none
    # is skipped for overlap, so only the overrides decide which fires run.
    schedule = ScheduleFactory(
        job="tests.jobs.record", interval=step, start_at=start, misfire="all",
        overlap="concurrent",
    )  # fmt: skip
    skipped, moved, to = start + step, start + 2 * step, start + 2 * step + timedelta(seconds=2)
    schedule.skip_fire(skipped, "not this one", by="tests")
    schedule.move_fire(moved, to, "a little later", by="tests")
    child = children.start("--workers", "2")
    rows = Execution.objects.filter(schedule=schedule.name)
    wait_for(lambda: rows.filter(plan_time=moved + step).exists(), 60, "the fire after the move")
    assert child.terminate() == 0
    fates = sorted(Run.objects.filter(schedule=schedule).values_list("plan_time", "status"))
    assert sorted(rows.values_list("plan_time", flat=True))[:3] == [start, moved, moved + step], (
        fates
    )
    (moved_run,) = Run.objects.filter(schedule=schedule, plan_time=moved)
    assert moved_run.status == "succeeded" and moved_run.started_at >= to
    (execution,) = rows.filter(plan_time=moved)
    # The job's own row, by this machine's clock, which the database's shares here.
    assert execution.executed_at >= to - timedelta(seconds=0.1)
    (skipped_run,) = Run.objects.filter(schedule=schedule, plan_time=skipped)
    assert (skipped_run.status, skipped_run.error_code) == ("skipped", ErrorCode.OVERRIDDEN)


# -- the admin -------------------------------------------------------------------------------


def test_the_override_view_needs_the_permission_to_change_schedules(client, admin_client):
    from django.contrib.auth.models import Permission, User
    from django.urls import reverse

    schedule, first = hourly()
    url = reverse("admin:django_periodic_schedule_override", args=[schedule.pk])
    query = f"?action=skip&at={first.isoformat().replace('+', '%2B')}"
    viewer = User.objects.create_user("viewer", password="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(viewer)
    assert client.post(url + query, {"reason": "holiday"}).status_code == 403
    assert not schedule.overrides.exists()
    response = admin_client.post(url + query, {"reason": "holiday"})
    assert response.status_code == 302
    (override,) = schedule.overrides.all()
    assert (override.plan_time, override.move_to, override.by) == (first, None, "admin")


def changer(client):
    """A staff user who may change schedules, logged in."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("changer", password="changer", is_staff=True)
    codenames = ["view_schedule", "change_schedule"]
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("at", "error"),
    [
        (LAST_SECOND, "at must be before 9000-01-01 00:00 UTC."),
        (FIRST_DAY, "at must be at least 1900-01-01 00:00 UTC."),
    ],
)
def test_an_override_link_naming_a_time_out_of_range_is_refused_on_at(client, at, error):
    from django.urls import reverse

    schedule, _ = hourly()
    url = reverse("admin:django_periodic_schedule_override", args=[schedule.pk])
    query = {"action": "skip", "at": at.isoformat()}
    editor = changer(client)
    for response in (
        editor.get(url, query),
        editor.post(f"{url}?{urlencode(query)}", {"reason": "end of days"}),
    ):
        assert response.status_code == 400
        assert response.context["fire"].errors["at"] == [error]
        assert error in response.content.decode()
    assert not schedule.overrides.exists()


def test_a_move_out_of_range_is_refused_on_its_field(client):
    from django.urls import reverse

    schedule, first = hourly()
    url = reverse("admin:django_periodic_schedule_override", args=[schedule.pk])
    query = urlencode({"action": "move", "at": first.isoformat()})
    data = {"move_to": LAST_SECOND.isoformat(), "reason": "much later"}
    response = changer(client).post(f"{url}?{query}", data)
    assert response.status_code == 200
    assert response.context["form"].errors["move_to"] == [
        "move_to must be before 9000-01-01 00:00 UTC."
    ]
    assert not schedule.overrides.exists()
