"""Trigger math: fixed DST cases, cron validation, and property tests against a brute-force oracle.

Pure tests: no database, no Django settings.
"""

from __future__ import annotations

import functools
import itertools
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_periodic import testing
from django_periodic.timing.bounds import EARLIEST, LATEST, UNPLANNED
from django_periodic.timing.triggers import (
    MACROS,
    BoundedTrigger,
    CronTrigger,
    IntervalTrigger,
    InvalidTrigger,
    OnceTrigger,
    Trigger,
    _CronSpec,
    _parse_cron,
    cron,
    fire_times,
    parse_timezone,
    validate_cron,
)
from tests.helpers import utc

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"  # DST moves the clock by 30 minutes
CHATHAM = "Pacific/Chatham"  # UTC+12:45 / UTC+13:45
DST_DAYS = {  # (spring forward, fall back) in 2026
    BERLIN: (date(2026, 3, 29), date(2026, 10, 25)),
    NEW_YORK: (date(2026, 3, 8), date(2026, 11, 1)),
}
TIMEZONES = [
    "UTC",
    BERLIN,
    NEW_YORK,
    LORD_HOWE,
    CHATHAM,
    "Asia/Kolkata",
    "America/Sao_Paulo",
]
US = timedelta(microseconds=1)
HOURS_2 = timedelta(hours=2)
PROPERTY = settings(max_examples=200, deadline=None)


def local_day_fires(trigger: Trigger, tz: str, day: date) -> list[datetime]:
    """Fires from local midnight of `day` (inclusive) to the next local midnight (exclusive)."""
    start = datetime(day.year, day.month, day.day, tzinfo=ZoneInfo(tz))
    end = start + timedelta(days=1)  # wall-clock arithmetic: the next local midnight
    return testing.fire_times(trigger, start, end)


def wall_matches(spec: _CronSpec, wall: datetime) -> bool:
    """Vixie cron's matching rule, written independently of the trigger's croniter engine."""
    in_dom, in_dow = wall.day in spec.days, wall.isoweekday() % 7 in spec.weekdays
    day_ok = (in_dom and in_dow) if spec.days_and else (in_dom or in_dow)
    return (
        day_ok
        and wall.minute in spec.minutes
        and wall.hour in spec.hours
        and wall.month in spec.months
    )


def debian_wildcard(expression: str) -> bool:
    """cron(8)'s own test, written independently of the trigger: entry.c sets MIN_STAR / HR_STAR
    when the minute / hour field's first character is '*' (and @hourly sets HR_STAR)."""
    minute, hour = MACROS.get(expression.strip().lower(), expression).split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def local_wall(instant: datetime, tz: str) -> datetime:
    return instant.astimezone(ZoneInfo(tz)).replace(tzinfo=None)


def every(first: datetime, step: timedelta, count: int) -> list[datetime]:
    return [first + step * k for k in range(count)]


# --- fixed DST cases ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "tz", "day", "expected"),
    [
        # Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
        ("30 2 * * *", BERLIN, date(2026, 3, 28), [utc(2026, 3, 28, 1, 30)]),
        ("30 2 * * *", BERLIN, date(2026, 3, 29), [utc(2026, 3, 29, 1, 0)]),
        ("30 2 * * *", BERLIN, date(2026, 3, 30), [utc(2026, 3, 30, 0, 30)]),
        ("30 2 * * *", BERLIN, date(2026, 10, 25), [utc(2026, 10, 25, 0, 30)]),
        ("30 2 * * *", BERLIN, date(2026, 10, 26), [utc(2026, 10, 26, 1, 30)]),
        ("0 2 * * *", BERLIN, date(2026, 3, 29), [utc(2026, 3, 29, 1, 0)]),
        ("0 2 * * *", BERLIN, date(2026, 10, 25), [utc(2026, 10, 25, 0, 0)]),
        ("0,30 2 * * *", BERLIN, date(2026, 3, 29), [utc(2026, 3, 29, 1, 0)]),
        (
            "0,30 2,3 * * *",
            BERLIN,
            date(2026, 3, 29),
            [utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30)],
        ),
        (
            "0,30 2 * * *",
            BERLIN,
            date(2026, 10, 25),
            [utc(2026, 10, 25, 0), utc(2026, 10, 25, 0, 30)],
        ),
        # America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
        ("30 2 * * *", NEW_YORK, date(2026, 3, 8), [utc(2026, 3, 8, 7, 0)]),
        ("0 2 * * *", NEW_YORK, date(2026, 3, 8), [utc(2026, 3, 8, 7, 0)]),
        ("0,30 2 * * *", NEW_YORK, date(2026, 3, 8), [utc(2026, 3, 8, 7, 0)]),
        ("30 1 * * *", NEW_YORK, date(2026, 11, 1), [utc(2026, 11, 1, 5, 30)]),
        ("0 1 * * *", NEW_YORK, date(2026, 11, 1), [utc(2026, 11, 1, 5, 0)]),
        ("30 2 * * *", NEW_YORK, date(2026, 11, 1), [utc(2026, 11, 1, 7, 30)]),
        (
            "0,30 1 * * *",
            NEW_YORK,
            date(2026, 11, 1),
            [utc(2026, 11, 1, 5), utc(2026, 11, 1, 5, 30)],
        ),
        # Australia/Lord_Howe: 2026-10-04 02:00 +10:30 -> 02:30 +11; 2026-04-05 02:00 +11 ->
        # 01:30 +10:30. The catch-up for 02:00 and the real 02:30 are one instant: one fire.
        ("15 2 * * *", LORD_HOWE, date(2026, 10, 4), [utc(2026, 10, 3, 15, 30)]),
        ("0,30 2 * * *", LORD_HOWE, date(2026, 10, 4), [utc(2026, 10, 3, 15, 30)]),
        ("45 1 * * *", LORD_HOWE, date(2026, 4, 5), [utc(2026, 4, 4, 14, 45)]),
        # Pacific/Chatham: 2026-09-27 02:45 +12:45 -> 03:45 +13:45; 2026-04-05 03:45 +13:45 ->
        # 02:45 +12:45.
        ("0 3 * * *", CHATHAM, date(2026, 9, 27), [utc(2026, 9, 26, 14)]),
        ("0 3 * * *", CHATHAM, date(2026, 4, 5), [utc(2026, 4, 4, 13, 15)]),
    ],
)
def test_fixed_time_jobs_follow_the_wall_clock(expression, tz, day, expected):
    assert local_day_fires(CronTrigger(expression, tz), tz, day) == expected


def test_berlin_30_2_fires_once_on_the_fall_back_day_unlike_plain_croniter():
    trigger = CronTrigger("30 2 * * *", BERLIN)
    fires = fire_times(trigger, 3, utc(2026, 10, 24, 12))
    assert fires == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]
    # Starting inside the repeated hour, after the first 02:30, must not fire a second time.
    assert trigger.next_after(utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 26, 1, 30)
    assert trigger.latest_at_or_before(utc(2026, 10, 25, 1, 45)) == utc(2026, 10, 25, 0, 30)


def test_spring_forward_fire_is_at_the_change_instant():
    trigger = CronTrigger("30 2 * * *", BERLIN)
    assert trigger.next_after(utc(2026, 3, 29, 0, 59)) == utc(2026, 3, 29, 1, 0)
    assert trigger.next_after(utc(2026, 3, 29, 1, 0)) == utc(2026, 3, 30, 0, 30)
    assert trigger.latest_at_or_before(utc(2026, 3, 29, 1, 0)) == utc(2026, 3, 29, 1, 0)
    assert trigger.latest_at_or_before(utc(2026, 3, 29, 0, 59)) == utc(2026, 3, 28, 1, 30)


def test_two_hourly_job_is_a_wildcard_job():
    # cron(8): the hour field starts with '*', so 02:00 follows real time like '0 * * * *'.
    berlin = CronTrigger("0 */2 * * *", BERLIN)
    spring = local_day_fires(berlin, BERLIN, date(2026, 3, 29))
    assert spring == [utc(2026, 3, 28, 23), *every(utc(2026, 3, 29, 2), HOURS_2, 10)]
    fall = local_day_fires(berlin, BERLIN, date(2026, 10, 25))
    assert fall == [
        utc(2026, 10, 24, 22),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 1),
        *every(utc(2026, 10, 25, 3), HOURS_2, 10),
    ]
    new_york = CronTrigger("0 */2 * * *", NEW_YORK)
    assert local_day_fires(new_york, NEW_YORK, date(2026, 3, 8))[:3] == [
        utc(2026, 3, 8, 5),
        utc(2026, 3, 8, 8),
        utc(2026, 3, 8, 10),
    ]
    assert len(local_day_fires(new_york, NEW_YORK, date(2026, 11, 1))) == 12


def test_wildcard_hour_step_skips_gap_times_like_cron8():
    # The tracker's case: Sunday 2026-03-29 matches by day of week (both day fields restricted).
    trigger = CronTrigger("15,45 */2 1-7 * 0", BERLIN)
    spring = local_day_fires(trigger, BERLIN, date(2026, 3, 29))
    assert utc(2026, 3, 29, 1) not in spring  # no catch-up at 03:00 CEST for 02:15 / 02:45
    assert spring[:3] == [
        utc(2026, 3, 28, 23, 15),
        utc(2026, 3, 28, 23, 45),
        utc(2026, 3, 29, 2, 15),
    ]
    assert [local_wall(f, BERLIN).strftime("%H:%M") for f in spring[:4]] == [
        "00:15",
        "00:45",
        "04:15",
        "04:45",
    ]
    assert trigger.next_after(utc(2026, 3, 28, 23, 45)) == utc(2026, 3, 29, 2, 15)
    assert trigger.latest_at_or_before(utc(2026, 3, 29, 2, 14)) == utc(2026, 3, 28, 23, 45)
    # Fall back (Sunday 2026-10-25): 02:15 and 02:45 fire in CEST and again in CET.
    fall = local_day_fires(trigger, BERLIN, date(2026, 10, 25))
    assert fall[2:6] == every(utc(2026, 10, 25, 0, 15), timedelta(minutes=30), 4)


@pytest.mark.parametrize(
    ("expression", "tz", "day", "expected"),
    [
        # Lord_Howe spring: 02:15 does not exist, so no catch-up fire at 02:30.
        (
            "15 */2 * * *",
            LORD_HOWE,
            date(2026, 10, 4),
            [utc(2026, 10, 3, 13, 45), *every(utc(2026, 10, 3, 17, 15), HOURS_2, 10)],
        ),
        # Lord_Howe fall: the minute field starts with '5', so cron(8) treats this as
        # fixed-time despite the later '*': 01:30 fires once, in +11.
        (
            "5,*/30 1 * * *",
            LORD_HOWE,
            date(2026, 4, 5),
            [utc(2026, 4, 4, 14), utc(2026, 4, 4, 14, 5), utc(2026, 4, 4, 14, 30)],
        ),
        # Chatham spring: 03:00 does not exist; the next fire is 06:00 +13:45.
        (
            "0 */3 * * *",
            CHATHAM,
            date(2026, 9, 27),
            [utc(2026, 9, 26, 11, 15), *every(utc(2026, 9, 26, 16, 15), timedelta(hours=3), 6)],
        ),
        # Chatham fall: 02:45 fires in +13:45 and again in +12:45.
        (
            "45 */2 * * *",
            CHATHAM,
            date(2026, 4, 5),
            [utc(2026, 4, 4, 11), utc(2026, 4, 4, 13), *every(utc(2026, 4, 4, 14), HOURS_2, 11)],
        ),
    ],
)
def test_cron8_classification_on_30_and_45_minute_dst_changes(expression, tz, day, expected):
    assert local_day_fires(CronTrigger(expression, tz), tz, day) == expected


@pytest.mark.parametrize("tz", [BERLIN, NEW_YORK])
@pytest.mark.parametrize(
    ("expression", "normal", "spring", "fall"),
    [
        ("*/15 * * * *", 96, 92, 100),
        ("* * * * *", 1440, 1380, 1500),
        ("0 * * * *", 24, 23, 25),
        ("@hourly", 24, 23, 25),
        ("0 */1 * * *", 24, 23, 25),
        ("30 2 * * *", 1, 1, 1),
        ("15 1,13 * * *", 2, 2, 2),
    ],
)
def test_fires_per_local_day(tz, expression, normal, spring, fall):
    spring_day, fall_day = DST_DAYS[tz]
    trigger = CronTrigger(expression, tz)
    assert len(local_day_fires(trigger, tz, date(2026, 6, 15))) == normal
    assert len(local_day_fires(trigger, tz, spring_day)) == spring
    assert len(local_day_fires(trigger, tz, fall_day)) == fall


def test_frequent_jobs_follow_real_time():
    every_15 = CronTrigger("*/15 * * * *", BERLIN)
    # Spring: 01:45 CET is followed directly by 03:00 CEST.
    assert fire_times(every_15, 2, utc(2026, 3, 29, 0, 30)) == [
        utc(2026, 3, 29, 0, 45),
        utc(2026, 3, 29, 1, 0),
    ]
    # Fall: 02:00-02:45 fire in CEST and again in CET.
    repeated = fire_times(every_15, 8, utc(2026, 10, 25, 0) - US)
    assert repeated == [utc(2026, 10, 25, 0) + timedelta(minutes=15 * k) for k in range(8)]
    assert [local_wall(f, BERLIN).hour for f in repeated] == [2] * 8
    hourly = CronTrigger("0 * * * *", BERLIN)
    assert hourly.latest_at_or_before(utc(2026, 10, 25, 1, 30)) == utc(2026, 10, 25, 1)
    assert hourly.next_after(utc(2026, 10, 25, 0, 10)) == utc(2026, 10, 25, 1)


def test_fire_times_stop_at_until_included():
    # The one walk over a trigger's fires: at most n, strictly after `after`, up to `until`.
    hourly = CronTrigger("0 * * * *", "UTC")
    start = utc(2026, 1, 1)
    assert fire_times(hourly, 10, start, utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
        utc(2026, 1, 1, 3),
    ]
    assert fire_times(hourly, 2, start, utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]
    assert fire_times(hourly, 10, start, utc(2026, 1, 1, 0, 59)) == []
    assert fire_times(hourly, 3, start) == fire_times(hourly, 3, start, None)


@pytest.mark.parametrize("tz", [BERLIN, NEW_YORK, LORD_HOWE, CHATHAM, "UTC"])
@pytest.mark.parametrize("expression", ["30 2 * * *", "0 2 * * *", "@daily", "15 1 * * *"])
def test_daily_job_fires_once_per_local_date_all_year(tz, expression):
    trigger = CronTrigger(expression, tz)
    start = datetime(2026, 1, 1, tzinfo=ZoneInfo(tz))
    fires = [
        f for f in fire_times(trigger, 370, start - US) if f.astimezone(ZoneInfo(tz)).year == 2026
    ]
    assert len(fires) == 365
    assert len({f.astimezone(ZoneInfo(tz)).date() for f in fires}) == 365


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@yearly", [utc(2025, 12, 31, 23), utc(2026, 12, 31, 23)]),
        ("@annually", [utc(2025, 12, 31, 23), utc(2026, 12, 31, 23)]),
        ("@monthly", [utc(2025, 12, 31, 23), utc(2026, 1, 31, 23)]),
        ("@weekly", [utc(2026, 1, 3, 23), utc(2026, 1, 10, 23)]),  # Sunday midnight
        ("@daily", [utc(2025, 12, 31, 23), utc(2026, 1, 1, 23)]),
        ("@midnight", [utc(2025, 12, 31, 23), utc(2026, 1, 1, 23)]),
        ("@hourly", [utc(2025, 12, 31, 23), utc(2026, 1, 1, 0)]),
    ],
)
def test_macros(macro, expected):
    assert fire_times(CronTrigger(macro, BERLIN), 2, utc(2025, 12, 31, 22)) == expected


def test_macros_are_case_insensitive_and_equal_their_expansion():
    base = utc(2026, 3, 1)
    assert fire_times(CronTrigger("@DAILY", BERLIN), 40, base) == fire_times(
        CronTrigger("0 0 * * *", BERLIN), 40, base
    )


# --- Vixie day-of-month / day-of-week --------------------------------------------------------


def days_fired(expression: str) -> list[date]:
    trigger = CronTrigger(expression)
    fires = fire_times(trigger, 400, utc(2025, 12, 31, 23, 59))
    return [f.date() for f in fires if f.year == 2026]


ALL_2026 = [date(2026, 1, 1) + timedelta(days=i) for i in range(365)]


@pytest.mark.parametrize(
    ("expression", "rule"),
    [
        ("0 0 1 * 1", lambda d: d.day == 1 or d.weekday() == 0),  # both restricted: OR
        ("0 0 13 * 5", lambda d: d.day == 13 or d.weekday() == 4),
        ("0 0 */2 * 1", lambda d: d.day % 2 == 1 and d.weekday() == 0),  # '*'-prefixed: AND
        ("0 0 1,15 * */2", lambda d: d.day in (1, 15) and d.isoweekday() % 7 in (0, 2, 4, 6)),
        ("0 0 * * 1", lambda d: d.weekday() == 0),
        ("0 0 1 * *", lambda d: d.day == 1),
        ("0 0 1-31 * 1", lambda d: True),  # OR with a field covering every day
        ("0 0 15 * 0-6", lambda d: True),
        ("0 0 * * 7", lambda d: d.weekday() == 6),
        ("0 0 * * 7-7", lambda d: d.weekday() == 6),  # croniter alone fires this every day
        ("0 0 * * 5-7", lambda d: d.weekday() in (4, 5, 6)),
        ("0 0 31 2,4 1", lambda d: d.month in (2, 4) and d.weekday() == 0),
    ],
)
def test_vixie_day_of_month_and_day_of_week(expression, rule):
    assert days_fired(expression) == [d for d in ALL_2026 if rule(d)]


# --- validation -----------------------------------------------------------------------------

FIELDS_MESSAGE = "Cron expression must have 5 fields (minute hour day-of-month month day-of-week)"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 * * * *", f"{FIELDS_MESSAGE}, got 6."),
        ("0 0 * *", f"{FIELDS_MESSAGE}, got 4."),
        ("", f"{FIELDS_MESSAGE}, got 0."),
        ("   ", f"{FIELDS_MESSAGE}, got 0."),
        ("61 * * * *", "Invalid minute field '61': 61 is out of range 0-59."),
        ("0 24 * * *", "Invalid hour field '24': 24 is out of range 0-23."),
        ("0 0 0 * *", "Invalid day-of-month field '0': 0 is out of range 1-31."),
        ("0 0 32 * *", "Invalid day-of-month field '32': 32 is out of range 1-31."),
        ("0 0 * 13 *", "Invalid month field '13': 13 is out of range 1-12."),
        ("0 0 * 0 *", "Invalid month field '0': 0 is out of range 1-12."),
        ("0 0 * * 8", "Invalid day-of-week field '8': 8 is out of range 0-7."),
        ("0 0 * * mox", "Invalid day-of-week field 'mox': unknown name 'mox'."),
        ("0 0 * * mon,mox", "Invalid day-of-week field 'mon,mox': unknown name 'mox'."),
        ("0 0 * foo *", "Invalid month field 'foo': unknown name 'foo'."),
        ("0 0 * * monday", "Invalid day-of-week field 'monday': unknown name 'monday'."),
        ("a * * * *", "Invalid minute field 'a': 'a' is not a number."),
        ("0 jan * * *", "Invalid hour field 'jan': 'jan' is not a number."),
        ("*/0 * * * *", "Invalid minute field '*/0': step must be at least 1."),
        ("0 1-5/0 * * *", "Invalid hour field '1-5/0': step must be at least 1."),
        ("*/x * * * *", "Invalid minute field '*/x': step 'x' is not a number."),
        ("*/ * * * *", "Invalid minute field '*/': step '' is not a number."),
        ("1/2/3 * * * *", "Invalid minute field '1/2/3': step '2/3' is not a number."),
        ("5-2 * * * *", "Invalid minute field '5-2': range 5-2 is reversed."),
        ("0 0 * * sat-sun", "Invalid day-of-week field 'sat-sun': range sat-sun is reversed."),
        ("-5 * * * *", "Invalid minute field '-5': '-5' is malformed."),
        ("1,,2 * * * *", "Invalid minute field '1,,2': empty list item."),
        ("0 0 L * *", "Invalid day-of-month field 'L': 'L' (last) is not supported."),
        ("0 0 * * 5L", "Invalid day-of-week field '5L': 'L' (last) is not supported."),
        (
            "0 0 15W * *",
            "Invalid day-of-month field '15W': 'W' (nearest weekday) is not supported.",
        ),
        ("0 0 LW * *", "Invalid day-of-month field 'LW': 'L' (last) is not supported."),
        ("0 0 ? * 1", "Invalid day-of-month field '?': '?' is not supported; use '*'."),
        ("0 0 * * 1#2", "Invalid day-of-week field '1#2': '#' (nth weekday) is not supported."),
        ("H * * * *", "Invalid minute field 'H': 'H' (hashed) is not supported."),
        ("H/5 * * * *", "Invalid minute field 'H/5': 'H' (hashed) is not supported."),
        ("0 H(0-5) * * *", "Invalid hour field 'H(0-5)': 'H' (hashed) is not supported."),
        ("\uff17 * * * *", "Invalid minute field '\uff17': '\uff17' is not a number."),
        ("100 * * * *", "Invalid minute field '100': 100 is out of range 0-59."),
        # Past the 4300 digits int() reads: judged by its length.
        (
            "1" * 5000 + " * * * *",
            f"Invalid minute field '{'1' * 5000}': a number of 5000 digits is out of range 0-59.",
        ),
        (
            "@reboot",
            "Unknown macro '@reboot'; use one of @yearly, @annually, @monthly, @weekly, @daily, "
            "@midnight, @hourly.",
        ),
        (
            "0 0 30 2 *",
            "Cron expression never fires: day-of-month '30' does not occur in month '2'.",
        ),
        (
            "0 0 31 apr,jun *",
            "Cron expression never fires: day-of-month '31' does not occur in month 'apr,jun'.",
        ),
    ],
)
def test_validate_cron_rejects_with_a_precise_message(expression, message):
    with pytest.raises(InvalidTrigger) as excinfo:
        validate_cron(expression)
    assert str(excinfo.value) == message
    assert isinstance(excinfo.value, ValueError)
    with pytest.raises(InvalidTrigger):
        CronTrigger(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "0 0 * * 7",
        "0 0 * * 0-7",
        "*/5 1-5/2 1,15 jan-mar MON-fri",
        "5/20 * * * *",
        "0 0 29 2 *",
        "0 0 31 * *",
        "0 0 30 2 1",  # OR: Mondays in February
        "  0   0 * * *  ",
        "0\t0 * * SUN",
        "59 23 31 12 6",
        "0-59/59 0-23/23 1-31/30 1-12/11 0-7/7",
        "*/90 * * * *",
        "00 05 * * *",
        "@yearly",
        "@Daily",
    ],
)
def test_validate_cron_accepts(expression):
    validate_cron(expression)
    assert CronTrigger(expression).next_after(utc(2026, 1, 1)) is not None


def test_a_step_past_the_fields_span_picks_its_first_value_whatever_its_length():
    after = utc(2026, 1, 1, 5)
    for step in ("24", "100", "9" * 5000):
        assert CronTrigger(f"0 */{step} * * *").next_after(after) == utc(2026, 1, 2)


def test_validate_cron_rejects_non_strings():
    with pytest.raises(InvalidTrigger, match="must be a string"):
        validate_cron(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expression", "fixed_time"),
    [
        ("30 2 * * *", True),
        ("0,30 9-17 * * *", True),
        ("0 1-23/2,*/3 * * *", True),  # cron(8) looks at the first character only
        ("0 1,*/2 * * *", True),
        ("5,*/30 1 * * *", True),
        ("0-59 2 * * *", True),
        ("0-59 0-23 * * *", True),
        ("@daily", True),
        ("@weekly", True),
        ("@monthly", True),
        ("@yearly", True),
        ("0 */2 * * *", False),
        ("0 */3 * * *", False),
        ("15,45 */2 1-7 * 0", False),
        ("0 */1 * * *", False),
        ("0 *,*/2 * * *", False),
        ("0 * * * *", False),
        ("@hourly", False),
        ("*/5 * * * *", False),
        ("*/5,7 2 * * *", False),
        ("* 2 * * *", False),
        ("*/30 2 * * *", False),
    ],
)
def test_debian_dst_classification(expression, fixed_time):
    assert _parse_cron(expression).fixed_time is fixed_time
    assert debian_wildcard(expression) is not fixed_time  # the oracle's copy of the rule


def test_parser_sets():
    spec = _parse_cron("*/15 9-17/4 1,15 jan-mar/2 5-7")
    assert spec.minutes == {0, 15, 30, 45}
    assert spec.hours == {9, 13, 17}
    assert spec.days == {1, 15}
    assert spec.months == {1, 3}
    assert spec.weekdays == {5, 6, 0}
    assert not spec.days_and
    assert _parse_cron("0 0 */10 * 1").days == {1, 11, 21, 31}
    assert _parse_cron("0 0 */10 * 1").days_and


# --- time zones -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "Nowhere/City", "Europe", "europe/berlin", "/etc/passwd", "../UTC", "localtime"]
)
def test_parse_timezone_rejects_unknown_names(name):
    with pytest.raises(InvalidTrigger) as excinfo:
        parse_timezone(name)
    assert str(excinfo.value) == f"Unknown time zone {name!r}."
    with pytest.raises(InvalidTrigger):
        CronTrigger("* * * * *", name)


def test_parse_timezone_accepts_iana_names():
    assert parse_timezone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    assert parse_timezone("UTC") == ZoneInfo("UTC")


def test_cron_trigger_value_semantics():
    trigger = CronTrigger("0 3 * * *", BERLIN)
    assert trigger == CronTrigger("0 3 * * *", BERLIN)
    assert hash(trigger) == hash(CronTrigger("0 3 * * *", BERLIN))
    assert repr(trigger) == (
        "CronTrigger(expression='0 3 * * *', timezone='Europe/Berlin', dst_gap='', dst_repeat='')"
    )
    assert trigger != CronTrigger("0 3 * * *", BERLIN, dst_gap="skip")
    assert CronTrigger("0 3 * * *").timezone == "UTC"


# --- interval -------------------------------------------------------------------------------

ANCHOR = datetime(2026, 1, 1, 12, 0, 0, 1, tzinfo=ZoneInfo(BERLIN))


def test_interval_fires_at_anchor_plus_multiples():
    trigger = IntervalTrigger(timedelta(minutes=7), ANCHOR)
    fires = fire_times(trigger, 5, ANCHOR - timedelta(hours=1))
    assert fires == [ANCHOR + timedelta(minutes=7 * k) for k in range(5)]
    assert all(f.tzinfo is UTC for f in fires)


def test_interval_has_no_drift_after_a_million_steps():
    every = timedelta(seconds=1, microseconds=333_333)
    trigger = IntervalTrigger(every, ANCHOR)
    millionth = ANCHOR + every * 1_000_000
    assert trigger.next_after(millionth - US) == millionth
    assert trigger.next_after(millionth) == millionth + every
    assert trigger.latest_at_or_before(millionth + every - US) == millionth
    fires = fire_times(trigger, 1000, millionth - US)
    assert all(b - a == every for a, b in itertools.pairwise(fires))


def test_interval_never_fires_before_the_anchor():
    trigger = IntervalTrigger(timedelta(hours=1), ANCHOR)
    assert trigger.next_after(ANCHOR - timedelta(days=400)) == ANCHOR
    assert trigger.latest_at_or_before(ANCHOR - US) is None
    assert trigger.latest_at_or_before(ANCHOR) == ANCHOR
    assert trigger.next_after(ANCHOR) == ANCHOR + timedelta(hours=1)


@pytest.mark.parametrize("every", [timedelta(0), timedelta(seconds=-1), 60, None])
def test_interval_must_be_positive(every):
    with pytest.raises(InvalidTrigger, match="Interval must be a positive timedelta"):
        IntervalTrigger(every, ANCHOR)


# --- once -----------------------------------------------------------------------------------


def test_once_fires_once():
    run_at = datetime(2026, 5, 1, 9, 30, tzinfo=ZoneInfo(BERLIN))
    trigger = OnceTrigger(run_at)
    assert trigger.next_after(run_at - US) == run_at
    assert trigger.next_after(run_at - US).tzinfo is UTC
    assert trigger.next_after(run_at) is None
    assert fire_times(trigger, 5, utc(2020, 1, 1)) == [run_at]
    assert trigger.latest_at_or_before(run_at) == run_at
    assert trigger.latest_at_or_before(run_at + timedelta(days=999)) == run_at
    assert trigger.latest_at_or_before(run_at - US) is None


# --- bounds ---------------------------------------------------------------------------------

BOUNDED_KINDS = {
    "cron": CronTrigger("0 * * * *", BERLIN),
    "interval": IntervalTrigger(timedelta(hours=1), utc(2026, 1, 1)),
    "once": OnceTrigger(utc(2026, 6, 1, 12)),
}


@pytest.mark.parametrize("kind", BOUNDED_KINDS)
def test_bounds_are_inclusive(kind):
    inner = BOUNDED_KINDS[kind]
    start = end = utc(2026, 6, 1, 12)
    if kind != "once":
        end = utc(2026, 6, 1, 15)
    trigger = BoundedTrigger(inner, start_at=start, end_at=end)
    expected = [start] if kind == "once" else [utc(2026, 6, 1, h) for h in range(12, 16)]
    assert fire_times(trigger, 10, utc(2026, 1, 1)) == expected
    assert trigger.next_after(end) is None
    assert trigger.latest_at_or_before(utc(2027, 1, 1)) == end
    if kind != "once":
        assert trigger.latest_at_or_before(end - US) == expected[-2]
    assert trigger.latest_at_or_before(start) == start
    assert trigger.latest_at_or_before(start - US) is None
    assert BoundedTrigger(inner, start_at=start).next_after(start - timedelta(days=9)) == start
    assert BoundedTrigger(inner, end_at=end).latest_at_or_before(utc(2030, 1, 1)) == end


@pytest.mark.parametrize("kind", ["interval", "once"])
def test_end_before_every_fire_gives_none(kind):
    trigger = BoundedTrigger(BOUNDED_KINDS[kind], end_at=utc(2025, 1, 1))  # fires start in 2026
    assert trigger.next_after(utc(2024, 1, 1)) is None
    assert trigger.latest_at_or_before(utc(2030, 1, 1)) is None
    assert fire_times(trigger, 3, utc(2024, 1, 1)) == []


def test_end_before_start_of_search_gives_none():
    trigger = BoundedTrigger(BOUNDED_KINDS["cron"], end_at=utc(2025, 1, 1, 0, 30))
    assert trigger.next_after(utc(2025, 1, 1)) is None
    assert trigger.latest_at_or_before(utc(2030, 1, 1)) == utc(2025, 1, 1)
    inside = BoundedTrigger(BOUNDED_KINDS["cron"], utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 59))
    assert inside.latest_at_or_before(utc(2030, 1, 1)) is None  # no whole hour within the bounds


def test_bounds_exclude_fires_outside():
    trigger = BoundedTrigger(
        CronTrigger("30 * * * *"), start_at=utc(2026, 1, 1, 0, 31), end_at=utc(2026, 1, 1, 3, 29)
    )
    assert fire_times(trigger, 9, utc(2025, 1, 1)) == [utc(2026, 1, 1, h, 30) for h in (1, 2)]
    nested = BoundedTrigger(trigger, start_at=utc(2026, 1, 1, 2))
    assert fire_times(nested, 9, utc(2025, 1, 1)) == [utc(2026, 1, 1, 2, 30)]


def test_bounds_are_validated():
    with pytest.raises(InvalidTrigger, match="is before start_at"):
        BoundedTrigger(BOUNDED_KINDS["cron"], start_at=utc(2026, 1, 2), end_at=utc(2026, 1, 1))
    with pytest.raises(InvalidTrigger, match="must be a Trigger"):
        BoundedTrigger("0 * * * *")  # type: ignore[arg-type]


# --- the range of times (bounds.EARLIEST, bounds.LATEST) -------------------------------------

KIRITIMATI = "Pacific/Kiritimati"  # UTC+14: the first wall clock to reach a year
LAST = LATEST - US  # the last instant a fire may have


@pytest.mark.parametrize(
    "inner",
    [
        CronTrigger("0 * * * *", KIRITIMATI),
        IntervalTrigger(timedelta(hours=1), utc(2026, 1, 1)),
        IntervalTrigger(timedelta(days=36525), utc(8950, 1, 1)),  # the longest interval
        OnceTrigger(utc(8999, 12, 31, 23)),
    ],
    ids=["cron", "interval", "century", "once"],
)
def test_near_the_end_of_time_there_is_no_next_fire_rather_than_an_overflow(inner):
    trigger = BoundedTrigger(inner)
    for after in (LAST, LATEST, datetime(9999, 12, 31, 23, tzinfo=UTC)):
        assert trigger.next_after(after) is None
    last = trigger.latest_at_or_before(datetime(9999, 12, 31, 23, tzinfo=UTC))
    assert last is not None and last < LATEST
    assert last == trigger.latest_at_or_before(LAST)
    assert fire_times(trigger, 3, last) == []


def test_a_fire_just_before_the_end_of_time_still_fires():
    assert fire_times(BoundedTrigger(OnceTrigger(LAST)), 2, utc(8999, 1, 1)) == [LAST]
    yearly = BoundedTrigger(CronTrigger("0 0 1 1 *"))  # its 9000-01-01 is LATEST itself
    assert fire_times(yearly, 3, utc(8998, 6, 1)) == [utc(8999, 1, 1)]
    # In UTC+14 that new year comes ten hours before LATEST.
    kiritimati = BoundedTrigger(CronTrigger("0 0 1 1 *", KIRITIMATI))
    assert fire_times(kiritimati, 3, utc(8999, 6, 1)) == [utc(8999, 12, 31, 10)]


def test_no_fire_comes_before_the_earliest_time():
    daily = BoundedTrigger(CronTrigger("0 0 * * *"))
    assert daily.next_after(UNPLANNED) == EARLIEST
    assert daily.latest_at_or_before(EARLIEST - US) is None
    hourly = BoundedTrigger(IntervalTrigger(timedelta(hours=1), utc(1850, 1, 1)))
    assert hourly.next_after(utc(1850, 1, 1)) == EARLIEST
    assert hourly.latest_at_or_before(utc(1899, 6, 1)) is None


# --- naive datetimes ------------------------------------------------------------------------

NAIVE = datetime(2026, 1, 1, 12)


@pytest.mark.parametrize(
    "trigger",
    [*BOUNDED_KINDS.values(), BoundedTrigger(BOUNDED_KINDS["cron"], start_at=utc(2026, 1, 1))],
    ids=["cron", "interval", "once", "bounded"],
)
def test_naive_datetimes_are_rejected(trigger):
    for call in (trigger.next_after, trigger.latest_at_or_before):
        with pytest.raises(InvalidTrigger, match="must be timezone-aware"):
            call(NAIVE)
    with pytest.raises(InvalidTrigger, match="must be timezone-aware"):
        fire_times(trigger, 1, NAIVE)


def test_naive_definitions_are_rejected():
    with pytest.raises(InvalidTrigger, match="anchor must be timezone-aware"):
        IntervalTrigger(timedelta(hours=1), NAIVE)
    with pytest.raises(InvalidTrigger, match="run_at must be timezone-aware"):
        OnceTrigger(NAIVE)
    with pytest.raises(InvalidTrigger, match="start_at must be timezone-aware"):
        BoundedTrigger(BOUNDED_KINDS["once"], start_at=NAIVE)
    with pytest.raises(InvalidTrigger, match="end_at must be timezone-aware"):
        BoundedTrigger(BOUNDED_KINDS["once"], end_at=NAIVE)


def test_fire_times_edge_cases():
    assert fire_times(BOUNDED_KINDS["cron"], 0, utc(2026, 1, 1)) == []
    with pytest.raises(ValueError, match="n must be >= 0"):
        fire_times(BOUNDED_KINDS["cron"], -1, utc(2026, 1, 1))


# --- properties -----------------------------------------------------------------------------


@st.composite
def cron_field(draw, low: int, high: int, names: tuple[str, ...] = ()) -> str:
    def value(lo: int, hi: int) -> str:
        number = draw(st.integers(lo, hi))
        offset = 1 if high == 12 else 0  # month names start at 1
        if names and number - offset < len(names) and draw(st.booleans()):
            return draw(st.sampled_from([str.lower, str.upper, str.title]))(names[number - offset])
        return str(number)

    def item() -> str:
        kind = draw(st.sampled_from(["*", "*/s", "n", "a-b", "a-b/s", "n/s"]))
        step = f"/{draw(st.integers(1, high - low + 1))}"
        if kind.startswith("*"):
            return "*" + (step if "/" in kind else "")
        first = draw(st.integers(low, high))
        if kind.startswith("a-b"):
            last = draw(st.integers(first, high))
            return f"{value(first, first)}-{value(last, last)}" + (step if "/" in kind else "")
        return value(first, first) + (step if "/" in kind else "")

    return ",".join(item() for _ in range(draw(st.integers(1, 3))))


def valid(expression: str) -> bool:
    try:
        validate_cron(expression)
    except InvalidTrigger:
        return False
    return True


MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
cron_expressions = (
    st.tuples(
        cron_field(0, 59),
        cron_field(0, 23),
        st.one_of(st.just("*"), cron_field(1, 31)),
        st.one_of(st.just("*"), cron_field(1, 12, MONTHS)),
        st.one_of(st.just("*"), cron_field(0, 7, WEEKDAYS)),
    )
    .map(" ".join)
    .filter(valid)
)
# Mostly-every-day expressions, so a window of a day or two around a DST change sees fires.
# Hours that start with '*' yet name few hours, or hold a '*' after the first character, are
# where cron(8)'s first-character rule decides the DST handling, so they are drawn often.
dense_cron_expressions = st.tuples(
    cron_field(0, 59),
    st.one_of(cron_field(0, 23), st.sampled_from(["*/2", "*/3", "*/2,1", "1,*/2", "3,*/4"])),
    st.sampled_from(["*", "*", "*", "1-20", "*/2"]),
    st.just("*"),
    st.sampled_from(["*", "*", "*", "0-6", "1-5", "0,6"]),
).map(" ".join)


@functools.cache
def transitions(tz: str) -> tuple[datetime, ...]:
    """UTC instants (whole minutes) at which `tz` changes its offset, 2020-2030."""
    zone, found = ZoneInfo(tz), []
    at, end = utc(2020, 1, 1), utc(2031, 1, 1)
    while at < end:
        step = at + timedelta(hours=6)
        if at.astimezone(zone).utcoffset() != step.astimezone(zone).utcoffset():
            lo, hi = at, step
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                same = mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset()
                lo, hi = (mid, hi) if same else (lo, mid)
            found.append(hi)
        at = step
    return tuple(found)


@st.composite
def base_instants(draw, tz: str) -> datetime:
    """Instants across 2020-2030, often close to one of the zone's DST changes."""
    near = transitions(tz)
    if near and draw(st.booleans()):
        change = draw(st.sampled_from(near))
        return change + draw(st.timedeltas(-timedelta(hours=11), timedelta(hours=1)))
    return draw(st.datetimes(datetime(2020, 1, 1), datetime(2030, 12, 31))).replace(tzinfo=UTC)


@st.composite
def cron_cases(draw, expressions=cron_expressions):
    tz = draw(st.sampled_from(TIMEZONES))
    return draw(expressions), tz, draw(base_instants(tz))


def is_gap_fire(expression: str, tz: str, fire: datetime) -> bool:
    """A fixed-time fire at a spring-forward instant standing for a skipped matching wall time."""
    zone, spec = ZoneInfo(tz), _parse_cron(expression)
    before, after = (fire - US).astimezone(zone).utcoffset(), fire.astimezone(zone).utcoffset()
    if debian_wildcard(expression) or not after > before:
        return False
    wall, gap_end = local_wall(fire, tz) - (after - before), local_wall(fire, tz)
    while wall < gap_end:
        if wall_matches(spec, wall):
            return True
        wall += timedelta(minutes=1)
    return False


@PROPERTY
@given(cron_cases())
def test_cron_fires_are_increasing_matching_and_consistent(case):
    expression, tz, base = case
    trigger, spec = CronTrigger(expression, tz), _parse_cron(expression)
    fires = fire_times(trigger, 20, base)
    assert fires, "every valid expression fires"
    assert fires[0] > base
    assert all(a < b for a, b in itertools.pairwise(fires))
    assert all(f.tzinfo is UTC and f.second == f.microsecond == 0 for f in fires)
    for fire in fires:
        assert wall_matches(spec, local_wall(fire, tz)) or is_gap_fire(expression, tz, fire)
        assert trigger.latest_at_or_before(fire) == fire
    for previous, fire in itertools.pairwise(fires):
        assert trigger.latest_at_or_before(fire - US) == previous
    latest = trigger.latest_at_or_before(base)
    if latest is not None:
        assert latest <= base
        assert trigger.next_after(latest) == fires[0]


def oracle_fires(expression: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """Brute force, minute by minute in real time: fires in [start, end) as cron(8) runs them.

    Wildcard jobs (debian_wildcard) run at each minute whose wall time matches, so a skipped
    wall time never fires and a repeated one fires twice. Other jobs run when the wall clock
    first reaches or jumps over a matching time: cron(8)'s catch-up after a jump forward, and
    nothing again while a fall-back repeats wall times (cron.c, main loop).
    """
    spec, fixed_time = _parse_cron(expression), not debian_wildcard(expression)
    minute = timedelta(minutes=1)
    at = start - timedelta(hours=6)
    high_water = local_wall(at, tz)  # latest wall time the clock has shown so far
    fires = []
    while (at := at + minute) < end:
        wall = local_wall(at, tz)
        if fixed_time:
            # Fires when the clock first reaches or jumps over a matching wall time.
            skipped = [high_water + minute * k for k in range(1, (wall - high_water) // minute + 1)]
            fire = any(wall_matches(spec, w) for w in skipped)
            high_water = max(high_water, wall)
        else:
            fire = wall_matches(spec, wall)
        if fire and at >= start:
            fires.append(at)
    return fires


@PROPERTY
@given(cron_cases(dense_cron_expressions))
def test_cron_agrees_with_brute_force_oracle(case):
    expression, tz, base = case
    trigger = CronTrigger(expression, tz)
    start = base.replace(second=0, microsecond=0) + timedelta(minutes=1)
    end = start + timedelta(hours=12)
    expected = oracle_fires(expression, tz, start, end)
    actual = []
    fire = trigger.next_after(start - US)
    while fire is not None and fire < end:
        actual.append(fire)
        fire = trigger.next_after(fire)
    assert actual == expected
    if expected:
        assert trigger.latest_at_or_before(end - US) == expected[-1]


positive_intervals = st.timedeltas(timedelta(microseconds=1), timedelta(days=10))
aware_datetimes = st.datetimes(
    datetime(2020, 1, 1),
    datetime(2030, 12, 31),
    timezones=st.sampled_from([ZoneInfo(t) for t in TIMEZONES]),
)


@PROPERTY
@given(positive_intervals, aware_datetimes, aware_datetimes)
def test_interval_properties(every, anchor, base):
    trigger = IntervalTrigger(every, anchor)
    # Aware datetimes inside a DST gap or fold never compare equal across zones (PEP 495).
    anchor = anchor.astimezone(UTC)
    fires = fire_times(trigger, 20, base)
    assert len(fires) == 20
    assert fires[0] > base and fires[0] >= anchor
    assert all(b - a == every for a, b in itertools.pairwise(fires))
    assert all(f.tzinfo is UTC and (f - anchor) % every == timedelta(0) for f in fires)
    assert trigger.latest_at_or_before(fires[0]) == fires[0]
    latest = trigger.latest_at_or_before(base)
    if latest is None:
        assert base < anchor and fires[0] == anchor
    else:
        assert latest <= base < fires[0] and fires[0] - latest == every


@PROPERTY
@given(aware_datetimes, aware_datetimes)
def test_once_properties(run_at, base):
    trigger = OnceTrigger(run_at)
    run_at = run_at.astimezone(UTC)  # see test_interval_properties
    fires = fire_times(trigger, 20, base)
    assert fires == ([run_at] if run_at > base else [])
    assert trigger.latest_at_or_before(run_at) == run_at
    assert trigger.latest_at_or_before(base) == (run_at if run_at <= base else None)


@PROPERTY
@given(cron_cases(dense_cron_expressions), st.timedeltas(timedelta(0), timedelta(hours=6)))
def test_bounded_cron_is_the_inner_fires_within_bounds(case, length):
    expression, tz, base = case
    inner = CronTrigger(expression, tz)
    start, end = base + timedelta(hours=2), base + timedelta(hours=2) + length
    trigger = BoundedTrigger(inner, start_at=start, end_at=end)
    expected, fire = [], inner.next_after(base)
    while fire is not None and fire <= end:
        expected += [fire] if fire >= start else []
        fire = inner.next_after(fire)
    assert fire_times(trigger, len(expected) + 1, base) == expected
    assert trigger.latest_at_or_before(end + timedelta(days=1)) == (
        expected[-1] if expected else None
    )


def test_cron_triggers_are_shared_between_schedules_with_the_same_expression():
    assert cron("0 3 * * *", "Europe/Berlin") is cron("0 3 * * *", "Europe/Berlin")
    assert cron("0 3 * * *", "Europe/Berlin") == CronTrigger("0 3 * * *", "Europe/Berlin")
    with pytest.raises(InvalidTrigger, match="minute"):
        cron("61 * * * *")
