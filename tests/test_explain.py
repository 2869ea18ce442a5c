"""Explaining every fire (``Schedule.explain()``): each fire of a window gets one account of
what became of it, read from what real planning and execution left in the ledger, with
closed and paused spans expanded fire by fire and nothing stored for them."""

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import planner
from django_periodic.models import (
    Calendar,
    ExplainPage,
    FireOverride,
    Run,
    Schedule,
    ScheduleVersion,
)
from django_periodic.models.explaining.pages import PAGE_SIZE
from django_periodic.testing import run_due
from django_periodic.timing import bounds
from tests.factories import ScheduleFactory
from tests.helpers import output_of, set_cursor
from tests.models import Execution

TEN = timedelta(minutes=10)


def base() -> datetime:
    """A 10-minute boundary an hour or more ahead of the database's clock: the schedules of
    these tests are created now, so their fires from then on are theirs."""
    now = clock.now() + timedelta(hours=1)
    return now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0)


def every_ten(**fields) -> Schedule:
    values = {
        "cron": "*/10 * * * *",
        "timezone": "UTC",
        "interval": None,
        "job": "tests.jobs.record",
    }
    return ScheduleFactory(**(values | fields))


def outcomes(schedule: Schedule, since: datetime, until: datetime, **options) -> list[tuple]:
    return [
        (account.plan_time, account.status, account.code)
        for account in schedule.explain(since, until, **options)
    ]


@pytest.mark.django_db(transaction=True)
def test_ran_running_and_skipped_fires_say_what_their_runs_say():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    run_due(now=b)  # runs the fire at b
    planner.plan_due(b + TEN)  # pending: no worker took it
    planner.plan_due(b + 2 * TEN)  # the pending one still active: overlap skips this one
    schedule.refresh_from_db()
    assert outcomes(schedule, b, b + 4 * TEN) == [
        (b, "succeeded", ""),
        (b + TEN, "pending", ""),
        (b + 2 * TEN, "skipped", ErrorCode.OVERLAP),
        (b + 3 * TEN, "not_planned_yet", ""),
    ]
    # The job's own effect, not the ledger's mark: it ran for the first fire alone.
    ran = Execution.objects.filter(schedule=schedule.name).values_list("plan_time", flat=True)
    assert list(ran) == [b]
    account = schedule.explain(b, b + TEN)[0]
    assert account.run_id == Run.objects.get(schedule=schedule, plan_time=b).pk
    assert json.loads(json.dumps(account.as_dict()))["plan_time"] == b.isoformat()


@pytest.mark.django_db(transaction=True)
def test_a_failed_fire_says_its_error_code_and_message():
    b = base()
    schedule = every_ten(job="tests.jobs.explode", kwargs={"message": "disk full"})
    set_cursor(schedule, b)
    run_due(now=b)
    (account,) = schedule.explain(b, b + TEN)
    assert (account.status, account.code) == ("failed", "RuntimeError")
    assert "disk full" in account.detail


@pytest.mark.django_db(transaction=True)
def test_missed_fires_are_skipped_by_the_misfire_policy():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    run_due(now=b + 3 * TEN + timedelta(minutes=5))  # down for half an hour: latest runs
    schedule.refresh_from_db()
    assert outcomes(schedule, b, b + 4 * TEN) == [
        (b, "skipped", ErrorCode.MISSED),
        (b + TEN, "skipped", ErrorCode.MISSED),
        (b + 2 * TEN, "skipped", ErrorCode.MISSED),
        (b + 3 * TEN, "succeeded", ""),
    ]
    assert Execution.objects.filter(schedule=schedule.name).count() == 1


@pytest.mark.django_db(transaction=True)
def test_missed_fires_past_the_catchup_limit_are_expanded_from_their_one_row(settings):
    settings.DJANGO_PERIODIC = {"CATCHUP_LIMIT": 2}
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    planner.plan_due(b + 8 * TEN)  # down for 80 minutes: 3 rows for the 8 missed fires
    schedule.refresh_from_db()
    assert Run.objects.filter(schedule=schedule, status="skipped").count() == 4
    accounts = schedule.explain(b, b + 9 * TEN)
    assert [(a.status, a.code) for a in accounts] == [
        *[("skipped", ErrorCode.MISSED)] * 8,
        ("pending", ""),
    ]
    assert "stands for the span" in accounts[5].detail


@pytest.mark.django_db(transaction=True)
def test_a_pause_is_expanded_to_every_fire_it_held_from_its_one_row():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    schedule.refresh_from_db()
    schedule.pause(b + 2 * TEN + timedelta(minutes=5), "database upgrade", by="ops")
    planner.plan_due(b)  # one skipped run for the pause; the cursor leaves it
    planner.plan_due(b + 3 * TEN)
    schedule.refresh_from_db()
    assert Run.objects.filter(schedule=schedule).count() == 2  # no row per paused fire
    accounts = schedule.explain(b, b + 4 * TEN)
    assert [(a.plan_time, a.status) for a in accounts] == [
        (b, "paused"),
        (b + TEN, "paused"),
        (b + 2 * TEN, "paused"),
        (b + 3 * TEN, "pending"),
    ]
    assert all("by ops: database upgrade" in a.detail for a in accounts[:3])
    assert Run.objects.filter(schedule=schedule).count() == 2  # explaining stored nothing


@pytest.mark.django_db(transaction=True)
def test_the_fires_of_a_pause_still_to_come_read_paused_and_those_after_not_planned_yet():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    schedule.refresh_from_db()
    schedule.pause(b + TEN + timedelta(minutes=5), "freeze", by="ops")
    accounts = schedule.explain(b, b + 3 * TEN)
    assert [(a.status, a.code) for a in accounts] == [
        ("paused", ErrorCode.PAUSED),
        ("paused", ErrorCode.PAUSED),
        ("not_planned_yet", ""),
    ]
    assert "by ops: freeze (not planned yet)" in accounts[0].detail
    assert not Run.objects.filter(schedule=schedule).exists()


@pytest.mark.django_db(transaction=True)
def test_a_closed_span_is_expanded_to_every_closed_fire_with_its_calendar():
    day = (clock.now() + timedelta(days=10)).replace(hour=0, minute=0, second=0, microsecond=0)
    closed = [f"{day + timedelta(days=n):%Y-%m-%d}" for n in (1, 2)]
    calendar = Calendar.objects.create(name="freeze", timezone="UTC", closed_dates=closed)
    schedule = every_ten(cron="0 9 * * *")
    schedule.calendars.add(calendar)
    Schedule.objects.filter(pk=schedule.pk).reschedule(day + timedelta(hours=10))
    nine = [day + timedelta(days=n, hours=9) for n in range(4)]
    for at in nine[1:]:
        planner.plan_due(at)
    schedule.refresh_from_db()
    accounts = schedule.explain(nine[1], nine[3] + TEN)
    assert [(a.plan_time, a.status, a.code) for a in accounts] == [
        (nine[1], "closed", ErrorCode.CLOSED),
        (nine[2], "closed", ErrorCode.CLOSED),
        (nine[3], "pending", ""),
    ]
    assert "'freeze'" in accounts[1].detail
    assert accounts[1].run_id is None  # the span's one row is the first fire's
    assert Run.objects.filter(schedule=schedule).count() == 2


@pytest.mark.django_db(transaction=True)
def test_overrides_say_who_skipped_or_moved_a_fire_and_why():
    b = base()
    schedule = every_ten()
    FireOverride.objects.create(
        schedule=schedule, plan_time=b + TEN, action="skip", reason="maintenance", by="ann"
    )
    FireOverride.objects.create(
        schedule=schedule,
        plan_time=b + 2 * TEN,
        action="move",
        move_to=b + 2 * TEN + timedelta(minutes=5),
        reason="after the report",
        by="bob",
    )
    accounts = schedule.explain(b + TEN, b + 3 * TEN)
    assert [(a.status, a.code) for a in accounts] == [
        ("overridden", ErrorCode.OVERRIDDEN),
        ("moved", ""),
    ]
    assert accounts[0].detail == "Skipped by ann: maintenance."
    assert "by bob: after the report" in accounts[1].detail


@pytest.mark.django_db(transaction=True)
def test_fires_out_of_bounds_and_ahead_of_the_cursor_say_so():
    b = base()
    schedule = every_ten(start_at=b + 2 * TEN, end_at=b + 4 * TEN)
    assert [status for _, status, _ in outcomes(schedule, b, b + 6 * TEN)] == [
        "before_start",
        "before_start",
        "not_planned_yet",
        "not_planned_yet",
        "not_planned_yet",
        "after_end",
    ]


@pytest.mark.django_db(transaction=True)
def test_its_versions_say_when_it_was_disabled_and_when_its_trigger_changed():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b + 3 * TEN)  # its cursor when it was enabled again
    planner.plan_due(b + 3 * TEN)
    # The rows the versions of its changes leave (docs/versions.md): a cron edited before b,
    # disabled between b + 5 minutes and b + 25 minutes.
    versions = [
        (b - TEN, {"cron": ["0 * * * *", "*/10 * * * *"]}),
        (b + timedelta(minutes=5), {"enabled": [True, False]}),
        (b + timedelta(minutes=25), {"enabled": [False, True]}),
    ]
    for revision, (at, changes) in enumerate(versions, 2):
        ScheduleVersion.objects.create(
            schedule=schedule, revision=revision, created_at=at, changes=changes
        )
    schedule.refresh_from_db()
    assert [status for _, status, _ in outcomes(schedule, b - 2 * TEN, b + 4 * TEN)] == [
        "before_change",
        "no_record",  # after the edit, before it was disabled: no run, no reason
        "no_record",
        "disabled",
        "disabled",
        "pending",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_past_fire_with_no_run_and_no_reason_says_no_record():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    planner.plan_due(b)
    set_cursor(schedule, b + 2 * TEN)  # a cursor moved past a fire by hand
    planner.plan_due(b + 2 * TEN)
    schedule.refresh_from_db()
    account = schedule.explain(b + TEN, b + 2 * TEN)[0]
    assert account.status == "no_record"
    assert "should not happen" in account.detail


@pytest.mark.django_db(transaction=True)
def test_a_fanned_out_fire_sums_up_its_scopes_or_gives_one_scope():
    b = base()
    schedule = every_ten(job="tests.jobs.per_tenant", scopes="tests.regions")
    set_cursor(schedule, b)
    run_due(now=b)
    (summed,) = schedule.explain(b, b + TEN)
    assert (summed.status, summed.scopes, summed.run_id) == ("succeeded", {"succeeded": 2}, None)
    (one,) = schedule.explain(b, b + TEN, scope="eu")
    assert (one.status, one.scope) == ("succeeded", "eu")
    assert one.run_id == Run.objects.get(schedule=schedule, scope="eu").pk


@pytest.mark.django_db(transaction=True)
def test_explaining_ten_thousand_fires_costs_as_many_queries_as_ten():
    b = base()
    schedule = ScheduleFactory(interval=timedelta(seconds=1), start_at=b)
    set_cursor(schedule, b)
    planner.plan_due(b)
    schedule.refresh_from_db()

    def queries(seconds: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            accounts = schedule.explain(b, b + timedelta(seconds=seconds))
        assert len(accounts) == seconds
        return len(captured)

    assert queries(10_000) == queries(10) <= 8


@pytest.mark.django_db
def test_a_bad_window_is_refused():
    schedule = every_ten()
    now = clock.now()
    with pytest.raises(ValueError, match="after since"):
        schedule.explain(now, now)
    with pytest.raises(ValueError, match="narrow it"):
        schedule.explain(datetime(2000, 1, 1, tzinfo=UTC), datetime(2010, 1, 1, tzinfo=UTC))


@pytest.mark.django_db
def test_a_window_out_of_the_range_of_times_is_refused_before_any_work():
    schedule = every_ten()
    now = clock.now()
    first_day = datetime(1, 1, 1, tzinfo=UTC)
    last_second = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-5)))
    refusals = [
        (lambda: schedule.explain(first_day, now), "since must be at least 1900-01-01"),
        (lambda: schedule.explain(now, last_second), "until must be at most 9000-01-01"),
        (lambda: schedule.explain_page(now, now + TEN, after=last_second), "after must be"),
        (lambda: schedule.explain_page(now, now.replace(tzinfo=None)), "timezone-aware"),
    ]
    for call, message in refusals:
        with (
            CaptureQueriesContext(connection) as captured,
            pytest.raises(ValueError, match=message),
        ):
            call()
        assert not captured.captured_queries  # nothing read, nothing computed


@pytest.mark.django_db
def test_a_page_of_a_window_of_any_length_costs_what_a_short_one_does():
    schedule = every_ten(cron="* * * * *")
    now = clock.now()

    def page(since: datetime, until: datetime) -> tuple[ExplainPage, int]:
        with CaptureQueriesContext(connection) as captured:
            found = schedule.explain_page(since, until)
        return found, len(captured)

    short, short_queries = page(now, now + timedelta(hours=1))
    ages, ages_queries = page(bounds.EARLIEST, bounds.LATEST)  # 3.7 billion fires
    assert (len(short.accounts), short.next_after) == (60, None)
    assert len(ages.accounts) == PAGE_SIZE
    assert ages.next_after == ages.accounts[-1].plan_time
    assert ages_queries == short_queries


@pytest.mark.django_db(transaction=True)
def test_pages_tell_what_one_call_tells_of_a_fire_shifted_past_its_page():
    # Every minute of Saturdays, a day its calendar closes: each fire runs on Sunday at its
    # time instead. The Saturday fires fill a page; the run of its last one, on Sunday, is
    # in the next page's part of the window, and told once, by its fire's account.
    ahead = clock.now() + timedelta(days=2)
    saturday = (ahead + timedelta(days=(5 - ahead.weekday()) % 7)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    calendar = Calendar.objects.create(name="saturdays", timezone="UTC", closed_weekdays=[5])
    schedule = every_ten(cron="* * * * 6", on_closed_day="next_open_day")
    schedule.calendars.add(calendar)
    last_fire = saturday + timedelta(hours=23, minutes=59)
    its_run_at = last_fire + timedelta(days=1)
    set_cursor(schedule, its_run_at)
    planner.plan_due(its_run_at)
    (run,) = Run.objects.filter(schedule=schedule)
    assert run.plan_time == its_run_at
    schedule.refresh_from_db()
    since, until = saturday, saturday + timedelta(days=2)
    first = schedule.explain_page(since, until)
    second = schedule.explain_page(since, until, after=first.next_after)
    assert (first.next_after, second.next_after) == (last_fire, None)
    assert [*first.accounts, *second.accounts] == schedule.explain(since, until)
    assert len(first.accounts) == PAGE_SIZE and not second.accounts
    told = first.accounts[-1]
    assert (told.plan_time, told.run_id) == (last_fire, run.pk)
    assert "instead" in told.detail


@pytest.mark.django_db(transaction=True)
def test_periodic_status_explain_prints_json_accounts():
    b = base()
    schedule = every_ten(name="nightly")
    set_cursor(schedule, b)
    run_due(now=b)
    printed = output_of(
        "periodic_status",
        "--explain",
        "nightly",
        "--since",
        b.isoformat(),
        "--until",
        (b + 2 * TEN).isoformat(),
        "--json",
    )
    found = json.loads(printed)
    assert [(row["plan_time"], row["status"]) for row in found["fires"]] == [
        (b.isoformat(), "succeeded"),
        ((b + TEN).isoformat(), "not_planned_yet"),
    ]
    text = output_of(
        "periodic_status", "--explain", "nightly", "--since", "1h", "--until", (b + TEN).isoformat()
    )
    assert f"{b:%Y-%m-%d %H:%M:%S}Z  succeeded  run #" in text


@pytest.mark.django_db
def test_periodic_status_explain_refuses_an_unknown_schedule_and_a_bad_window():
    every_ten(name="nightly")
    with pytest.raises(CommandError, match="No schedule named 'nope'"):
        output_of("periodic_status", "--explain", "nope")
    with pytest.raises(CommandError, match="Not a time"):
        output_of("periodic_status", "--explain", "nightly", "--since", "yesterday")


# -- with the parts that make fires' accounts: overrides, max_runs, RRULE ---------------------


@pytest.mark.django_db(transaction=True)
def test_fires_the_planner_skipped_or_moved_for_overrides_say_so():
    b = base()
    schedule = every_ten()
    set_cursor(schedule, b)
    schedule.skip_fire(b + TEN, "maintenance", by="ann")
    schedule.move_fire(b + 2 * TEN, b + 2 * TEN + timedelta(minutes=5), "after the report")
    for now in (b, b + TEN, b + 2 * TEN + timedelta(minutes=5)):
        run_due(now=now)
    schedule.refresh_from_db()
    assert outcomes(schedule, b, b + 3 * TEN) == [
        (b, "succeeded", ""),
        (b + TEN, "overridden", ErrorCode.OVERRIDDEN),
        (b + 2 * TEN, "succeeded", ""),  # at its new time, keyed by its own
    ]
    # The job's own rows: the skipped fire never ran, the moved one ran once.
    ran = Execution.objects.filter(schedule=schedule.name).values_list("plan_time", flat=True)
    assert sorted(ran) == [b, b + 2 * TEN]


@pytest.mark.django_db(transaction=True)
def test_fires_after_the_planner_ended_a_schedule_at_max_runs_say_so():
    b = base()
    schedule = every_ten(max_runs=2)
    set_cursor(schedule, b)
    for now in (b, b + TEN, b + 2 * TEN):
        run_due(now=now)
    schedule.refresh_from_db()
    assert (schedule.fire_count, schedule.next_fire_at) == (2, None)
    assert [status for _, status, _ in outcomes(schedule, b, b + 4 * TEN)] == [
        "succeeded",
        "succeeded",
        "after_max_runs",
        "after_max_runs",
    ]
    ran = Execution.objects.filter(schedule=schedule.name).values_list("plan_time", flat=True)
    assert sorted(ran) == [b, b + TEN]


@pytest.mark.django_db(transaction=True)
def test_an_rrule_schedule_is_explained_and_its_edit_diffed_as_cron_is():
    b = base()
    schedule = every_ten(cron="", rrule="FREQ=MINUTELY;INTERVAL=10", start_at=b)
    set_cursor(schedule, b)
    run_due(now=b)
    schedule.refresh_from_db()
    assert outcomes(schedule, b, b + 2 * TEN) == [
        (b, "succeeded", ""),
        (b + TEN, "not_planned_yet", ""),
    ]
    diff = schedule.fire_diff(days=1, rrule="FREQ=MINUTELY;INTERVAL=20")
    removed = {fire.at for fire in diff.removed}
    assert b + TEN in removed and b + 2 * TEN not in removed and not diff.added
