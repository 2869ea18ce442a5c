"""RRULE, the fourth trigger kind: RFC 5545 rules on a zone's wall clock from start_at, the
DST rules cron has, the bounds clean() enforces, a bad row failing alone, and the planner
and a real scheduler firing at the rule's times."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil import rrule as dateutil_rrule
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic import job
from django_periodic.admin.forms import ScheduleForm
from django_periodic.choices import ErrorCode
from django_periodic.db import clock
from django_periodic.engine.planning import code_schedules, decisions, planner
from django_periodic.models import Calendar, Run, Schedule, SchedulerProcess
from django_periodic.policies import Occupancy
from django_periodic.testing import assert_fire_times, fire_times
from django_periodic.timing import recurrences
from django_periodic.timing.recurrences import RRuleTrigger
from django_periodic.timing.triggers import InvalidTrigger
from tests.factories import ScheduleFactory, due_row, schedule_form_data
from tests.helpers import set_cursor, utc
from tests.models import Execution
from tests.processes import wait_for

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = "America/New_York"
LAST_WORKING_DAY = "RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1"
US = timedelta(microseconds=1)


def paris(*args: int) -> datetime:
    return datetime(*args, tzinfo=PARIS).astimezone(UTC)


def fires(text: str, start: datetime, n: int, zone: str = "Europe/Paris", **dst) -> list:
    trigger = RRuleTrigger(text, start, zone, **dst)
    found, after = [], start - US
    while len(found) < n and (fire := trigger.next_after(after)) is not None:
        found.append(fire)
        after = fire
    return found


# -- the trigger math, against hand-computed times -------------------------------------------


def test_the_last_working_day_of_each_month_at_the_time_of_start_at():
    start = paris(2026, 1, 1, 9)
    assert fires(LAST_WORKING_DAY, start, 5) == [
        paris(2026, 1, 30, 9),  # a Friday
        paris(2026, 2, 27, 9),  # a Friday
        paris(2026, 3, 31, 9),  # a Tuesday, after the change to summer time
        paris(2026, 4, 30, 9),
        paris(2026, 5, 29, 9),  # the 30th and 31st are a weekend
    ]
    assert paris(2026, 3, 31, 9) == datetime(2026, 3, 31, 7, tzinfo=UTC)


def test_every_second_tuesday_and_a_bare_rule_without_its_rrule_prefix():
    start = paris(2026, 1, 1, 18, 30)
    expected = [paris(2026, 1, 13, 18, 30), paris(2026, 2, 10, 18, 30), paris(2026, 3, 10, 18, 30)]
    assert fires("FREQ=MONTHLY;BYDAY=2TU", start, 3) == expected
    assert fires("RRULE:FREQ=MONTHLY;BYDAY=2TU", start, 3) == expected


def test_exdate_removes_a_fire_and_rdate_adds_one_as_wall_times_or_utc():
    text = (
        "RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0\n"
        "EXDATE:20260102T090000\n"
        "RDATE:20260102T120000,20260103T060000Z"
    )
    assert fires(text, paris(2026, 1, 1), 4) == [
        paris(2026, 1, 1, 9),
        paris(2026, 1, 2, 12),
        paris(2026, 1, 3, 7),  # 06:00 UTC is 07:00 in Paris
        paris(2026, 1, 3, 9),
    ]


def test_count_and_until_end_the_rule_until_in_utc_included():
    start = paris(2026, 1, 1, 9)
    assert fires("FREQ=DAILY;COUNT=3", start, 10) == [paris(2026, 1, d, 9) for d in (1, 2, 3)]
    until = "FREQ=DAILY;UNTIL=20260103T080000Z"  # 09:00 in Paris: the last fire
    assert fires(until, start, 10) == [paris(2026, 1, d, 9) for d in (1, 2, 3)]


def test_a_daily_fire_that_spring_forward_skips_runs_at_the_change_unless_skipped():
    start = paris(2026, 3, 27)
    text = "FREQ=DAILY;BYHOUR=2;BYMINUTE=30"
    change = datetime(2026, 3, 29, 1, tzinfo=UTC)  # 02:00 CET becomes 03:00 CEST
    assert fires(text, start, 3) == [paris(2026, 3, 27, 2, 30), paris(2026, 3, 28, 2, 30), change]
    skipped = fires(text, start, 3, dst_gap="skip")
    assert skipped == [
        paris(2026, 3, 27, 2, 30),
        paris(2026, 3, 28, 2, 30),
        paris(2026, 3, 30, 2, 30),
    ]


def test_a_daily_fire_that_fall_back_repeats_runs_once_unless_both():
    start = paris(2026, 10, 24)
    text = "FREQ=DAILY;BYHOUR=2;BYMINUTE=30"
    first, second = (
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
    )
    assert fires(text, start, 3)[1:] == [first, paris(2026, 10, 26, 2, 30)]
    assert fires(text, start, 3, dst_repeat="both")[1:] == [first, second]


def test_an_hourly_rule_follows_the_wall_clock_through_both_changes_in_new_york():
    spring = fires("FREQ=HOURLY", datetime(2026, 3, 8, 6, tzinfo=UTC), 3, NEW_YORK)  # 01:00 EST
    assert spring == [datetime(2026, 3, 8, h, tzinfo=UTC) for h in (6, 7, 8)]  # 01:00, 03:00, 04:00
    autumn = fires("FREQ=HOURLY", datetime(2026, 11, 1, 4, tzinfo=UTC), 4, NEW_YORK)  # 00:00 EDT
    assert autumn == [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (4, 5, 6, 7)]  # 01:00 twice


def test_latest_at_or_before_is_the_fire_before_the_next():
    trigger = RRuleTrigger(LAST_WORKING_DAY, paris(2026, 1, 1, 9), "Europe/Paris")
    assert trigger.latest_at_or_before(paris(2026, 3, 31, 8)) == paris(2026, 2, 27, 9)
    assert trigger.latest_at_or_before(paris(2026, 3, 31, 9)) == paris(2026, 3, 31, 9)
    assert trigger.latest_at_or_before(paris(2025, 12, 1)) is None


def test_a_frequent_rule_from_long_ago_answers_near_now_without_walking_from_its_start():
    trigger = RRuleTrigger("FREQ=SECONDLY;INTERVAL=7", datetime(1990, 1, 1, tzinfo=UTC), "UTC")
    now = datetime(2026, 11, 28, 20, 0, 3, tzinfo=UTC)
    seconds = int((now - datetime(1990, 1, 1, tzinfo=UTC)).total_seconds())
    previous = datetime(1990, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds // 7 * 7)
    assert trigger.latest_at_or_before(now) == previous  # a billion seconds on: instant
    assert trigger.next_after(now) == previous + timedelta(seconds=7)


def test_a_rule_that_cannot_start_afresh_walks_on_and_back_through_its_kept_window():
    """COUNT counts from DTSTART: such a rule is listed from it, keeping only a window."""
    start = datetime(2026, 1, 1, 6, tzinfo=UTC)
    trigger = RRuleTrigger("FREQ=DAILY;COUNT=2000", start, "UTC")
    day = timedelta(days=1)
    assert trigger.next_after(start + 1500 * day) == start + 1501 * day
    assert trigger.latest_at_or_before(start + 100 * day + US) == start + 100 * day
    assert trigger.next_after(start + 1999 * day) is None
    assert trigger.latest_at_or_before(start + 5000 * day) == start + 1999 * day


RULES = [
    "FREQ=DAILY;BYHOUR=9,17",
    "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,FR",
    "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1",
    "FREQ=HOURLY;INTERVAL=5;BYMINUTE=10,40",
    "FREQ=MINUTELY;INTERVAL=37\nEXDATE:20260101T003700",
    "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29",
    "FREQ=DAILY;COUNT=40\nRDATE:20260301T120000",
]


@settings(max_examples=150, deadline=None)
@given(
    rule=st.sampled_from(RULES),
    days=st.integers(0, 3000),
    seconds=st.integers(0, 86399),
)
def test_in_utc_next_and_latest_are_dateutils_own_after_and_before(rule, days, seconds):
    """Oracle: dateutil asked directly, from DTSTART, on UTC (where a wall time is its
    instant): the window and the restarts near the time asked must not change an answer."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    moment = start - timedelta(days=100) + timedelta(days=days, seconds=seconds)
    moment = moment.replace(tzinfo=None)  # dateutil's wall times, which are UTC's instants
    naive = start.replace(tzinfo=None)
    oracle = dateutil_rrule.rrulestr(rule, dtstart=naive, forceset=True)
    trigger = recurrences.rrule(rule, start, "UTC")
    after, before = oracle.after(moment), oracle.before(moment, inc=True)
    aware = moment.replace(tzinfo=UTC)
    assert trigger.next_after(aware) == (after and after.replace(tzinfo=UTC))
    assert trigger.latest_at_or_before(aware) == (before and before.replace(tzinfo=UTC))


@settings(max_examples=100, deadline=None)
@given(rule=st.sampled_from(RULES), hours=st.integers(0, 24 * 800))
def test_in_new_york_no_fire_lies_between_a_moment_and_the_next(rule, hours):
    trigger = recurrences.rrule(rule, datetime(2026, 1, 1, 5, tzinfo=UTC), NEW_YORK)
    moment = datetime(2025, 12, 1, tzinfo=UTC) + timedelta(hours=hours, minutes=7)
    following = trigger.next_after(moment)
    if following is not None:
        assert following > moment
        assert trigger.latest_at_or_before(following) == following
        latest = trigger.latest_at_or_before(following - US)
        assert latest is None or latest <= moment


# -- validation: clean(), the form's and every path's rules ----------------------------------


def rrule_schedule(text: str, **fields) -> Schedule:
    fields.setdefault("start_at", paris(2026, 1, 1, 9))
    return Schedule(
        name="rule", job="tests.jobs.noop", interval=None, rrule=text, timezone="Europe/Paris",
        **fields,
    )  # fmt: skip


def clean_errors(schedule: Schedule) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        schedule.full_clean()
    return caught.value.message_dict


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("FREQ=FORTNIGHTLY", "rrule", "Invalid RRULE 'FREQ=FORTNIGHTLY'"),
        ("FREQ=DAILY;BYHOUR=25", "rrule", "hour must be in 0..23"),
        ("DTSTART:20260101T000000\nRRULE:FREQ=DAILY", "rrule", "Remove the DTSTART line"),
        ("FREQ=DAILY\nEXDATE;TZID=Europe/Paris:20260101T090000", "rrule", "takes no parameter"),
        ("FREQ=DAILY\nRDATE:95000101T000000", "rrule", "out of range"),
        ("FREQ=DAILY\nSUMMARY:x", "rrule", "Unknown line 'SUMMARY'"),
        ("FREQ=MONTHLY;BYMONTH=2;BYMONTHDAY=30", "rrule", "never fires: its days of the month"),
        ("FREQ=DAILY;COUNT=1\nEXDATE:20260101T090000", "rrule", "has no fire after"),
        ("FREQ=DAILY;INTERVAL=0", "rrule", "INTERVAL must be at least 1"),
        ("FREQ=DAILY;" + "BYHOUR=1;" * 500, "rrule", "at most 4000 characters"),
    ],
)
@pytest.mark.django_db
def test_a_bad_rule_is_a_clear_error_on_its_field(text, field, message):
    errors = clean_errors(rrule_schedule(text))
    assert any(message in error for error in errors[field]), errors


@pytest.mark.django_db
def test_a_rule_needs_start_at_and_is_the_only_trigger():
    assert (
        "set start_at" in clean_errors(rrule_schedule("FREQ=DAILY", start_at=None))["start_at"][0]
    )
    both = clean_errors(rrule_schedule("FREQ=DAILY", cron="0 9 * * *"))
    assert "Set exactly one trigger" in both["cron"][0]


@pytest.mark.django_db
def test_a_rule_firing_more_often_than_min_interval_is_refused(settings):
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": timedelta(seconds=30)}
    by_period = clean_errors(rrule_schedule("FREQ=SECONDLY;INTERVAL=10"))["rrule"]
    assert by_period == ["This rule fires 10 s apart, under MIN_INTERVAL (30 s)."]
    by_sample = clean_errors(rrule_schedule("FREQ=HOURLY;BYMINUTE=0;BYSECOND=0,20"))["rrule"]
    assert by_sample == ["This rule fires 20 s apart, under MIN_INTERVAL (30 s)."]
    rrule_schedule("FREQ=MINUTELY;BYSECOND=0,30").full_clean(exclude=["name"])


# Paris in 2026, as the tz database has it (the EU's rule: changes at 01:00 UTC). On 29 March
# 02:00 CET becomes 03:00 CEST, so 02:30 does not exist; on 25 October 03:00 CEST becomes
# 02:00 CET, so 02:30 happens twice, at 00:30 UTC and again at 01:30 UTC.
DAILY, HOURLY = "FREQ=DAILY;BYHOUR=2;BYMINUTE=30", "FREQ=HOURLY;BYMINUTE=30"
# A window around each change for each rule: three days for the daily rule, from local 01:00
# to 04:00 for the hourly one.
SPRING_WINDOW = {
    DAILY: (utc(2026, 3, 28), utc(2026, 3, 31)),
    HOURLY: (utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)),
}
FALL_WINDOW = {
    DAILY: (utc(2026, 10, 24), utc(2026, 10, 27)),
    HOURLY: (utc(2026, 10, 24, 23), utc(2026, 10, 25, 3)),
}
# Their fires in UTC by the choice for that change (empty: the rule's default, first_valid
# and once for a daily rule, skip and both for an hourly one).
SPRING_FIRES = {
    (DAILY, "skip"): [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30)],  # none on the 29th
    # On the 29th at the change, 03:00 CEST.
    (DAILY, "first_valid"): [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)],
    (DAILY, ""): [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)],
    # 01:30 CET and 03:30 CEST; 02:30 at the change, 03:00 CEST, or not at all.
    (HOURLY, "skip"): [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)],
    (HOURLY, "first_valid"): [
        utc(2026, 3, 29, 0, 30),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 29, 1, 30),
    ],
    (HOURLY, ""): [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)],
}
FALL_FIRES = {
    (DAILY, "once"): [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
    # On the 25th at 02:30 CEST, then at 02:30 CET.
    (DAILY, "both"): [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 1, 30),
        utc(2026, 10, 26, 1, 30),
    ],
    (DAILY, ""): [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
    # 01:30 CEST, 02:30 CEST, 02:30 CET (or not), 03:30 CET.
    (HOURLY, "once"): [
        utc(2026, 10, 24, 23, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 2, 30),
    ],
    (HOURLY, "both"): [utc(2026, 10, 24, 23, 30), *(utc(2026, 10, 25, h, 30) for h in (0, 1, 2))],
    (HOURLY, ""): [utc(2026, 10, 24, 23, 30), *(utc(2026, 10, 25, h, 30) for h in (0, 1, 2))],
}


@pytest.mark.django_db
@pytest.mark.parametrize("text", [DAILY, HOURLY])
@pytest.mark.parametrize("dst_gap", ["skip", "first_valid", ""])
@pytest.mark.parametrize("dst_repeat", ["once", "both", ""])
def test_dst_choices_apply_to_a_rule(text, dst_gap, dst_repeat):
    schedule = rrule_schedule(text, dst_gap=dst_gap, dst_repeat=dst_repeat)
    schedule.full_clean()
    assert_fire_times(schedule, *SPRING_WINDOW[text], SPRING_FIRES[text, dst_gap])
    assert_fire_times(schedule, *FALL_WINDOW[text], FALL_FIRES[text, dst_repeat])


def test_job_checks_a_rule_at_import(clean_registry):
    def report():
        return None

    dtstart = "DTSTART:20260101T000000\nRRULE:FREQ=DAILY"
    with pytest.raises(InvalidTrigger, match="Remove the DTSTART line"):
        job(name="report", rrule=dtstart, start_at=paris(2026, 1, 1))(report)
    with pytest.raises(TypeError, match="with start_at"):
        job(name="report", rrule="FREQ=DAILY")(report)


@pytest.mark.django_db
def test_a_rule_defined_in_code_is_synced_as_its_schedule(clean_registry):
    def report():
        return None

    start = paris(2026, 1, 1, 18)
    job(name="report", rrule=LAST_WORKING_DAY, start_at=start, timezone="Europe/Paris")(report)
    assert code_schedules.sync_code_schedules().created == ["report"]
    schedule = Schedule.objects.get(name="report")
    assert (schedule.trigger_kind, schedule.rrule, schedule.cron) == ("rrule", LAST_WORKING_DAY, "")
    assert schedule.next_fire_times(2, after=start) == [
        paris(2026, 1, 30, 18),
        paris(2026, 2, 27, 18),
    ]


# -- wrapped as the others: calendars, pause, the testing helper -----------------------------


@pytest.mark.django_db
def test_a_calendar_closes_a_rules_fires_as_it_closes_a_crons():
    weekends = Calendar.objects.create(
        name="weekends", timezone="Europe/Paris", closed_weekdays=[5, 6]
    )
    schedule = ScheduleFactory(
        interval=None, rrule="FREQ=DAILY", start_at=paris(2026, 3, 6, 9), timezone="Europe/Paris",
        on_closed_day="next_open_day",
    )  # fmt: skip
    schedule.calendars.add(weekends)
    found = fire_times(schedule, paris(2026, 3, 6), paris(2026, 3, 10))
    # Saturday's and Sunday's fires both move to Monday 09:00: one fire there.
    assert found == [paris(2026, 3, 6, 9), paris(2026, 3, 9, 9)]


def test_a_paused_rule_skips_its_fire_and_moves_to_the_next():
    start = paris(2026, 1, 1, 9)
    row = due_row(
        start, interval=None, rrule="FREQ=DAILY", timezone="Europe/Paris",
        paused_until=start + timedelta(hours=1), pause_reason="freeze",
    )  # fmt: skip
    decision = decisions.decide(row, start + timedelta(minutes=1), Occupancy())
    assert [(f.plan_time, f.error_code) for f in decision.fires] == [(start, ErrorCode.PAUSED)]
    assert decision.cursor == paris(2026, 1, 2, 9)


@pytest.mark.django_db
def test_a_rules_run_is_staggered_within_its_jitter_and_keeps_its_plan_time():
    start = paris(2026, 1, 1, 9)
    schedule = ScheduleFactory(
        interval=None, rrule="FREQ=DAILY", start_at=start, jitter=timedelta(minutes=10),
        timezone="Europe/Paris",
    )  # fmt: skip
    set_cursor(schedule, start)
    planner.plan_due(start + timedelta(seconds=1))
    (run,) = Run.objects.filter(schedule=schedule)
    assert run.plan_time == start
    assert start <= run.release_at < start + timedelta(minutes=10)


# -- the planner, and a bad row ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_planner_records_a_run_at_each_of_the_rules_times():
    start = paris(2026, 1, 1)
    schedule = ScheduleFactory(
        interval=None, rrule="FREQ=DAILY;BYHOUR=9,17;BYMINUTE=0", start_at=start,
        timezone="Europe/Paris", overlap="concurrent",  # the runs are not run here
    )  # fmt: skip
    set_cursor(schedule, paris(2026, 1, 1, 9))
    expected = [paris(2026, 1, 1, 9), paris(2026, 1, 1, 17), paris(2026, 1, 2, 9)]
    for at in expected:
        planner.plan_due(at + timedelta(seconds=1))
    runs = Run.objects.filter(schedule=schedule).order_by("plan_time")
    assert [(run.plan_time, run.status) for run in runs] == [(at, "pending") for at in expected]
    schedule.refresh_from_db()
    assert schedule.next_fire_at == paris(2026, 1, 2, 17)


@pytest.mark.django_db
def test_a_bad_rule_stored_past_validation_fails_its_schedule_alone(settings):
    settings.DJANGO_PERIODIC = {"PLANNING_FAILURE_LIMIT": 2}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    bad = ScheduleFactory(interval=None, rrule="FREQ=DAILY", start_at=start, name="bad")
    good = ScheduleFactory(interval=timedelta(seconds=10), start_at=start, name="good")
    Schedule.objects.filter(pk=bad.pk).update(rrule="FREQ=NOPE", next_fire_at=start)
    set_cursor(good, start)
    first = planner.plan_due(start + timedelta(seconds=1))
    second = planner.plan_due(start + timedelta(seconds=11))
    bad.refresh_from_db()
    assert first.failed == ["bad"] and second.disabled == ["bad"]
    assert not bad.enabled and "Invalid RRULE 'FREQ=NOPE'" in bad.last_error
    assert Run.objects.filter(schedule=good).count() == 2
    assert not Run.objects.filter(schedule=bad).exists()


# -- a real scheduler --------------------------------------------------------------------------


EVERY_2_SECONDS = "FREQ=SECONDLY;INTERVAL=2;COUNT=5"


@pytest.mark.processes
def test_a_running_scheduler_runs_a_rules_job_at_the_rules_times(children, postgres):
    """A real run_scheduler on PostgreSQL; the oracle is the rows the job writes."""
    child = children.start("--workers", "2")
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    start = clock.now().replace(microsecond=0) + timedelta(seconds=2)
    # Every 2 seconds, except the third fire; and one added half-way through the second gap.
    third = (start + timedelta(seconds=4)).strftime("%Y%m%dT%H%M%SZ")
    extra = (start + timedelta(seconds=3)).strftime("%Y%m%dT%H%M%SZ")
    schedule = ScheduleFactory(
        name="rule", job="tests.jobs.record", interval=None, start_at=start,
        timezone="Europe/Paris", rrule=f"{EVERY_2_SECONDS}\nEXDATE:{third}\nRDATE:{extra}",
    )  # fmt: skip
    executions = Execution.objects.filter(schedule="rule")
    wait_for(lambda: executions.count() >= 5, 60, "the rule's five fires to run")
    assert child.terminate() == 0
    seconds = [(e.plan_time - start).total_seconds() for e in executions.order_by("plan_time")]
    assert seconds == [0, 2, 3, 6, 8]
    schedule.refresh_from_db()
    assert schedule.next_fire_at is None  # COUNT=5: no fire after the last


# -- the admin's form --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_form_saves_an_rrule_schedule_and_clears_the_other_kinds():
    data = schedule_form_data(
        name="month end", trigger_kind="rrule", rrule=LAST_WORKING_DAY, cron="0 3 * * *",
        timezone="Europe/Paris", start_at="2027-01-01 08:00:00",
    )  # fmt: skip
    form = ScheduleForm(data)
    assert form.is_valid(), form.errors
    schedule = form.save()
    assert (schedule.trigger_kind, schedule.cron) == ("rrule", "")
    assert schedule.next_fire_at == paris(2027, 1, 29, 9)  # start_at 08:00 UTC: 09:00 in Paris


@pytest.mark.django_db
def test_the_admin_form_wants_the_rule_of_an_rrule_schedule():
    form = ScheduleForm(schedule_form_data(name="empty", trigger_kind="rrule", cron=""))
    assert form.errors["rrule"] == [
        "An RRULE trigger needs its rule (and start_at, where it starts)."
    ]


@pytest.mark.django_db
def test_the_admin_preview_lists_a_rules_fires_and_the_dst_changes_it_meets(admin_client):
    data = schedule_form_data(
        name="night", trigger_kind="rrule", rrule="FREQ=DAILY", cron="", timezone="Europe/Paris",
        start_at_0="2026-01-01", start_at_1="01:30:00",  # 02:30 in Paris
    )  # fmt: skip
    url = reverse("admin:django_periodic_schedule_preview")
    payload = admin_client.post(url, data).json()
    assert payload["errors"] == {} and payload["description"].startswith("RRULE FREQ=DAILY")
    assert len(payload["fires"]) == 10
    spring = next(c for c in payload["dst_changes"] if "starts" in c["change"])
    assert spring["rule"] == "default (first valid instant)"
    assert "02:30 does not exist" in spring["walls"]
    assert "03:00 CEST" in spring["result"]  # the change's first instant


@pytest.mark.django_db
def test_the_database_refuses_an_rrule_longer_than_a_trigger_reads():
    start = datetime(2030, 1, 1, tzinfo=UTC)
    schedule = ScheduleFactory(cron="", interval=None, rrule="FREQ=DAILY", start_at=start)
    # Valid text padded with EXDATE lines, past what trigger_of reads: refused on every path.
    too_long = "FREQ=DAILY" + "\nEXDATE:20300102T000000" * (recurrences.MAX_LENGTH // 20)
    assert len(too_long) > recurrences.MAX_LENGTH
    with pytest.raises(IntegrityError, match="rrule_length"), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(rrule=too_long)
    with pytest.raises(IntegrityError, match="rrule_length"), transaction.atomic():
        Schedule.objects.bulk_create([Schedule(name="long", job="tests.jobs.noop", rrule=too_long)])
    assert Schedule.objects.get(pk=schedule.pk).rrule == "FREQ=DAILY"
