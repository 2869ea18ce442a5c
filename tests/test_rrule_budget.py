"""No RRULE may pin a process: a rule that never fires is refused, a rare one is searched on a
budget, a COUNT rule is not walked from its start, on every path a rule takes (clean(), the
admin's preview and add form, the planner with a stored row).

A rule that dateutil would search to the year 9999 is computed in a thread here, so that a
regression fails the test (``answered``) rather than hang the run for hours.
"""

import calendar
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ValidationError
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_periodic.engine.planning import planner
from django_periodic.models import Run, Schedule, trigger_rows
from django_periodic.timing import recurrences, triggers
from tests.helpers import set_cursor

# A bound no budgeted computation comes near (each search stops within SEARCH_SECONDS of CPU
# time), and that one walking to the year 9999 (hours) cannot meet.
ANSWER_WITHIN = 60.0
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
# The rules the admin accepted work on for minutes to hours, each because it has no fire.
NEVER_FIRES = [
    "FREQ=SECONDLY;BYSETPOS=2",
    "FREQ=MINUTELY;BYSETPOS=-2",
    "FREQ=HOURLY;BYSETPOS=-2",
    "FREQ=DAILY;BYSETPOS=2",
    "FREQ=SECONDLY;BYMONTH=1;BYYEARDAY=-1",
    "FREQ=DAILY;BYWEEKNO=53;BYMONTH=1;BYDAY=MO",
    "FREQ=DAILY;BYMONTH=1;BYYEARDAY=200",
    "FREQ=MONTHLY;BYDAY=6MO",
    "FREQ=WEEKLY;BYSETPOS=9",
]
# Those that took seconds, not hours, before: the admin's own paths can run them directly.
NEVER_FIRES_IN_SECONDS = [
    "FREQ=DAILY;BYSETPOS=2",
    "FREQ=DAILY;BYWEEKNO=53;BYMONTH=1;BYDAY=MO",
    "FREQ=DAILY;BYMONTH=1;BYYEARDAY=200",
]


def answered(compute, *args):
    """What ``compute(*args)`` returns or raises, computed in a thread given ANSWER_WITHIN
    seconds (the test fails if it is still searching then)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = compute(*args)
        except Exception as exc:  # the answer may be an error: the caller judges it
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(ANSWER_WITHIN)
    assert not worker.is_alive(), f"still searching after {ANSWER_WITHIN} s: {args}"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]


def first_fire(text: str, start_at: datetime = NOW) -> datetime | None:
    """Build the rule, judge its sample (as validation does), and find its next fire."""
    trigger = recurrences.RRuleTrigger(text, start_at, "Europe/Paris")
    trigger.sample  # noqa: B018 (validation reads it first)
    return trigger.next_after(NOW)


@pytest.mark.parametrize("text", NEVER_FIRES)
def test_a_rule_that_never_fires_is_refused(text):
    with pytest.raises(triggers.InvalidTrigger, match="never fires"):
        answered(first_fire, text)


@pytest.mark.parametrize("text", NEVER_FIRES_IN_SECONDS)
@pytest.mark.django_db
def test_clean_refuses_a_rule_that_never_fires_on_its_field(text):
    schedule = Schedule(
        name="never", job="tests.jobs.noop", rrule=text, start_at=NOW, timezone="Europe/Paris"
    )
    with pytest.raises(ValidationError) as caught:
        schedule.full_clean()
    assert any("never fires" in message for message in caught.value.message_dict["rrule"])


def leap_years_with_monday_31st(after: int) -> int:
    """The first leap year from ``after`` whose 31 December is a Monday, by the calendar."""
    return next(
        year
        for year in range(after, 9000)
        if calendar.isleap(year) and calendar.weekday(year, 12, 31) == calendar.MONDAY
    )


def test_a_rule_that_fires_once_in_decades_is_found():
    # Day 366 is 31 December of a leap year; a Monday one comes every 28 years or so.
    found = answered(first_fire, "FREQ=DAILY;BYYEARDAY=366;BYDAY=MO")
    year = leap_years_with_monday_31st(NOW.year)
    assert found == datetime(year, 12, 31, 12, tzinfo=UTC)  # 13:00 in Paris, as NOW


def test_a_leap_second_is_a_clear_error():
    with pytest.raises(triggers.InvalidTrigger, match="BYSECOND=60 is out of range"):
        first_fire("FREQ=SECONDLY;BYSECOND=60")


# -- the admin: the preview and the add form, as a user with add permission ----------------

PREVIEW_URL = reverse("admin:django_periodic_schedule_preview")


@pytest.fixture
def adder(client, db):
    user = User.objects.create_user("adder", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="add_schedule"))
    client.force_login(user)
    return client


def typed_rule(text: str) -> dict[str, str]:
    return {
        "name": "typed",
        "job": "tests.jobs.noop",
        "trigger_kind": "rrule",
        "rrule": text,
        "timezone": "Europe/Paris",
        "start_at_0": "2026-12-01",
        "start_at_1": "09:00:00",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FREQ=DAILY;BYSETPOS=2", "never fires"),
        ("FREQ=DAILY;BYMONTH=1;BYYEARDAY=200", "never fires"),
        ("FREQ=SECONDLY;BYSECOND=60", "BYSECOND=60 is out of range"),
    ],
)
def test_the_preview_answers_a_bad_rule_with_its_error(adder, text, message):
    response = adder.post(PREVIEW_URL, typed_rule(text))
    assert response.status_code == 200
    errors = " ".join(" ".join(texts) for texts in response.json()["errors"].values())
    assert message in errors


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FREQ=DAILY;BYSETPOS=2", "never fires"),
        ("FREQ=SECONDLY;BYSECOND=60", "BYSECOND=60 is out of range"),
    ],
)
def test_the_add_form_refuses_a_bad_rule_on_its_field(adder, text, message):
    response = adder.post(reverse("admin:django_periodic_schedule_add"), typed_rule(text))
    assert response.status_code == 200  # the form again, with its errors
    assert message in " ".join(response.context["adminform"].form.errors.get("rrule", []))
    assert not Schedule.objects.exists()


# -- the planner, with rows stored past validation ------------------------------------------


def stored_rule(name: str, text: str, start_at: datetime) -> Schedule:
    """A schedule written by bulk_create, as a migration or a script would: no clean()."""
    (schedule,) = Schedule.objects.bulk_create(
        [Schedule(name=name, job="tests.jobs.noop", rrule=text, start_at=start_at, timezone="UTC")]
    )
    return schedule


@pytest.mark.django_db(transaction=True)
def test_a_stored_rule_that_never_fires_fails_its_own_schedule_only():
    bad = stored_rule("never", "FREQ=SECONDLY;BYSETPOS=2", NOW - timedelta(days=1))
    good = stored_rule("hourly", "FREQ=HOURLY", NOW - timedelta(days=1))
    for schedule in (bad, good):
        set_cursor(schedule, NOW)
    answered(planner.plan_due, NOW)
    assert list(Run.objects.filter(schedule=good).values_list("plan_time", flat=True)) == [NOW]
    assert not Run.objects.filter(schedule=bad).exists()
    bad.refresh_from_db()
    assert "never fires" in bad.last_error


@pytest.mark.django_db(transaction=True)
def test_an_old_count_rule_is_planned_without_walking_from_its_start(monkeypatch):
    # A secondly rule counted from 1900 would need 3.9 billion steps to reach now; a budget
    # of a thousand leaves only arithmetic on its COUNT, and a walk of a few periods.
    from django_periodic.timing import rule_search

    monkeypatch.setattr(rule_search, "SEARCH_STEPS", 1_000)
    recurrences.rrule.cache_clear()
    start = datetime(1900, 1, 1, tzinfo=UTC)
    schedule = stored_rule("counted", "FREQ=SECONDLY;COUNT=10000000000", start)
    set_cursor(schedule, NOW)
    answered(planner.plan_due, NOW)
    planned = Run.objects.filter(schedule=schedule).values_list("plan_time", flat=True)
    assert list(planned) == [NOW]  # its fires are whole seconds from 1900 for 317 years
    assert recurrences.rrule(schedule.rrule, start, "UTC").next_after(NOW) == NOW + timedelta(
        seconds=1
    )


def test_a_count_rule_ends_at_its_last_counted_fire():
    # Ten fires of a rule with BY parts (counted ahead, not computed by arithmetic).
    trigger = recurrences.RRuleTrigger("FREQ=DAILY;BYDAY=MO,WE;COUNT=10", NOW, "UTC")
    fires = triggers.fire_times(trigger, 20, NOW - timedelta(seconds=1))
    days = [NOW + timedelta(days=day) for day in range(40)]
    expected = [day for day in days if day.weekday() in (0, 2)][:10]
    assert fires == expected


def test_a_count_too_large_to_count_ahead_asks_for_until():
    with pytest.raises(triggers.InvalidTrigger, match="give UNTIL instead"):
        answered(first_fire, "FREQ=MINUTELY;BYHOUR=3;COUNT=100000000")


# -- any rule: validation answers, and a rule it accepts has its next fire -----------------

FREQUENCIES = ["SECONDLY", "MINUTELY", "HOURLY", "DAILY", "WEEKLY", "MONTHLY", "YEARLY"]
WEEKDAYS = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]


def values(low: int, high: int, signed: bool = False) -> st.SearchStrategy[str]:
    """A BY part's list of values, now and then out of its range."""
    value = st.integers(low - 1, high + 1)
    if signed:
        value = st.one_of(value, value.map(lambda number: -number))
    return st.lists(value, min_size=1, max_size=3).map(lambda items: ",".join(map(str, items)))


PARTS = {
    "INTERVAL": st.integers(1, 40).map(str),
    "BYSECOND": values(0, 59),
    "BYMINUTE": values(0, 59),
    "BYHOUR": values(0, 23),
    "BYMONTH": values(1, 12),
    "BYMONTHDAY": values(1, 31, signed=True),
    "BYYEARDAY": values(1, 366, signed=True),
    "BYWEEKNO": values(1, 53, signed=True),
    "BYSETPOS": values(1, 366, signed=True),
    "BYDAY": st.lists(
        st.tuples(st.sampled_from(["", "1", "-1", "5", "53"]), st.sampled_from(WEEKDAYS)),
        min_size=1,
        max_size=3,
    ).map(lambda days: ",".join(nth + day for nth, day in days)),
    "COUNT": st.integers(1, 10**9).map(str),
}


@st.composite
def rules(draw) -> str:
    names = draw(st.lists(st.sampled_from(sorted(PARTS)), max_size=4, unique=True))
    parts = [f"FREQ={draw(st.sampled_from(FREQUENCIES))}"]
    return ";".join(parts + [f"{name}={draw(PARTS[name])}" for name in names])


def judged(text: str, start_at: datetime) -> str:
    """What validation says of a rule (clean()'s rules for an RRULE, without the database),
    and, if it accepts it, its next fire after now (which must not raise)."""
    row = Schedule(rrule=text, start_at=start_at, timezone="Europe/Paris")
    errors = trigger_rows.trigger_field_errors(row)
    if errors:
        return f"refused: {errors}"
    try:
        trigger_rows.trigger_of(row).next_after(NOW)
    except triggers.InvalidTrigger as exc:
        return f"refused: {exc}"  # what clean() says of a rule too rare to reach now
    return f"next fire: {trigger_rows.trigger_of(row).next_after(NOW)}"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    text=rules(),
    start_at=st.datetimes(datetime(1900, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC)),
)
def test_every_rule_is_judged_and_an_accepted_one_fires_without_a_long_search(text, start_at):
    assert answered(judged, text, start_at)
