"""Every setting has a range: a value outside it (infinite, NaN, past what a time can be moved
by) is a system-check error, never a crash of the checks or of the scheduler. Any value at
all is either reported by ``manage.py check`` or runs ``run_scheduler``."""

import math
import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from hypothesis import HealthCheck, event, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_periodic.checks import check_settings
from django_periodic.conf import (
    BOOLEAN_KEYS,
    DURATION_KEYS,
    HOST_LIST_KEYS,
    INTEGER_KEYS,
    MAY_BE_NONE,
    RANGES,
    STRING_KEYS,
    InvalidSetting,
    PeriodicSettings,
    get_settings,
    parse,
)
from django_periodic.db import clock
from django_periodic.models import Run, Schedule
from django_periodic.timing import bounds
from tests.helpers import set_cursor

SECOND = timedelta(seconds=1)
SETTINGS_MD = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
DEFAULTS = PeriodicSettings()
KEYS = sorted(DURATION_KEYS | INTEGER_KEYS | STRING_KEYS | BOOLEAN_KEYS | HOST_LIST_KEYS)


def ids(settings, value) -> list[str]:
    settings.DJANGO_PERIODIC = value
    return [error.id for error in check_settings()]


# -- what the issue found --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("HEARTBEAT_INTERVAL", 10**13),
        ("ALERT_INTERVAL", 10**12),
        ("POLL_INTERVAL", math.inf),
        ("POLL_INTERVAL", -math.inf),
        ("IDLE_INTERVAL", math.nan),
        ("SHUTDOWN_GRACE", timedelta.max),
        ("KEEP_RUNS_FOR", 10**400),
        ("WORKERS", 10**9),
    ],
)
def test_a_value_no_time_can_be_moved_by_is_its_own_error(settings, key, value):
    assert ids(settings, {key: value}) == ["django_periodic.E010"]
    # Read as its default meanwhile: whatever reads the settings does not fail on it.
    assert getattr(get_settings(), key) == getattr(DEFAULTS, key)


@pytest.mark.django_db  # Django 6's check command also runs the database checks
@pytest.mark.parametrize("value", [math.inf, math.nan, 10**13])
def test_manage_py_check_reports_what_it_once_crashed_on(settings, value):
    # The checks of code-defined schedules read the settings too (HEARTBEAT_INTERVAL).
    settings.DJANGO_PERIODIC = {"POLL_INTERVAL": value, "HEARTBEAT_INTERVAL": value}
    with pytest.raises(SystemCheckError) as reported:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "django_periodic.E010" in str(reported.value)


def test_the_error_says_the_range(settings):
    settings.DJANGO_PERIODIC = {"HEARTBEAT_INTERVAL": 10**13, "POLL_INTERVAL": math.inf}
    assert [error.msg for error in check_settings()] == [
        "DJANGO_PERIODIC['HEARTBEAT_INTERVAL'] must be from 0 s (excluded) to 1 day, not 1e+13 s.",
        "DJANGO_PERIODIC['POLL_INTERVAL'] must be a finite number of seconds, not inf.",
    ]


def test_a_duration_that_rounds_to_nothing_is_not_positive(settings):
    # A nanosecond is 0 µs: as a timedelta, not positive.
    assert ids(settings, {"POLL_INTERVAL": 1e-9}) == ["django_periodic.E003"]
    assert ids(settings, {"POLL_INTERVAL": 1e-6, "PLAN_AHEAD": 1e-9}) == []


def test_the_ends_of_each_range_are_in_it_and_past_them_is_not(settings):
    for key, valid in RANGES.items():
        step = timedelta(microseconds=1) if key in DURATION_KEYS else 1
        assert ids(settings, {key: valid.high}) == [], key
        assert ids(settings, {key: valid.high + step}) != [], key
        below = valid.low if valid.low_open else valid.low - step
        assert ids(settings, {key: below}) != [], key
        if not valid.low_open:
            assert ids(settings, {key: valid.low}) == [], key


def test_a_setting_that_is_not_a_dict_reads_as_the_defaults(settings):
    assert ids(settings, [1, 2]) == ["django_periodic.E001"]
    assert get_settings() == DEFAULTS


# -- the ranges: every key, documented, safe to add to a time --------------------------------


def test_every_number_and_duration_has_a_range():
    assert set(RANGES) == DURATION_KEYS | INTEGER_KEYS


def test_every_duration_ceiling_can_be_added_to_any_time_a_scheduler_computes():
    # The loop adds a few times a duration (a process is stale after three heartbeats).
    for key in DURATION_KEYS:
        assert bounds.LATEST + 3 * RANGES[key].high < datetime.max.replace(tzinfo=UTC)
        assert bounds.EARLIEST - 3 * RANGES[key].high > datetime.min.replace(tzinfo=UTC)


def test_the_documented_ranges_are_the_checked_ones():
    documented = {}
    for line in SETTINGS_MD.read_text().splitlines():
        row = re.match(r"^\| `([A-Z_]+)` \| [^|]+ \| [^|]+ \| ([^|]+) \|", line)
        if row:
            documented[row.group(1)] = row.group(2).strip()
    assert set(documented) == set(KEYS)
    expected = {key: RANGES[key].describe() if key in RANGES else "—" for key in KEYS}
    assert documented == expected


# -- any value at all ------------------------------------------------------------------------


def _valid(key: str) -> st.SearchStrategy:
    """Values the checks take for ``key``: most small, as scheduler settings are."""
    if key in BOOLEAN_KEYS:
        return st.booleans()
    if key in STRING_KEYS:
        return st.sampled_from(["default", "dummy"])
    if key in HOST_LIST_KEYS:
        return st.sampled_from([[], ["127.0.0.1"], ["hc-ping.com", ".example.com"]])
    valid = RANGES[key]
    if key in INTEGER_KEYS:
        return st.integers(min_value=valid.low, max_value=valid.high).map(lambda n: min(n, 64))
    low = max(valid.low, timedelta(milliseconds=1))
    return st.one_of(
        st.floats(
            min_value=low.total_seconds(), max_value=min(valid.high, 5 * SECOND).total_seconds()
        ),
        st.timedeltas(min_value=low, max_value=valid.high),
        st.just(valid.high),
    )


# Anything a settings file may hold, the silly included.
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # infinities and NaN included
    st.sampled_from([math.inf, -math.inf, math.nan, 10**13, 10**400]),  # what no time can add
    st.timedeltas(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


def _mostly(likely: st.SearchStrategy, rarely: st.SearchStrategy) -> st.SearchStrategy:
    """``likely`` three times in four."""
    return st.integers(0, 3).flatmap(lambda n: rarely if n == 0 else likely)


def _value(key: str) -> st.SearchStrategy:
    if key not in KEYS:
        return ANYTHING  # no such key (E002), whatever its value
    return _mostly(_valid(key), st.none() | ANYTHING if key in MAY_BE_NONE else ANYTHING)


DICTIONARIES = st.sets(st.sampled_from([*KEYS, "WORKRES"]), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({key: _value(key) for key in sorted(keys)})
)
CONFIGURATIONS = _mostly(DICTIONARIES, ANYTHING)  # not even a dict: E001


@pytest.mark.django_db(transaction=True)
@hypothesis_settings(
    max_examples=30,  # seconds; about a third run the scheduler
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(configured=CONFIGURATIONS)
# What the issue found: each passed the checks, then crashed the scheduler or every check.
@example(configured={"POLL_INTERVAL": math.inf})
@example(configured={"ALERT_INTERVAL": 10**12})
@example(configured={"HEARTBEAT_INTERVAL": 10**13})
def test_any_settings_are_reported_by_check_or_run_the_scheduler(configured):
    with override_settings(DJANGO_PERIODIC=configured):
        try:
            call_command("check", stdout=StringIO(), stderr=StringIO())
        except SystemCheckError as reported:
            found = sorted(set(re.findall(r"django_periodic\.\w+", str(reported))))
            event(f"reported by check: {' '.join(found)}")
            return  # reported: run_scheduler, which runs the checks, would not start
        event("run_scheduler --once")
        schedule = Schedule.objects.create(
            name=f"due-{Schedule.objects.count()}",
            job="tests.jobs.noop",
            interval=bounds.CENTURY,  # no shorter than any MIN_INTERVAL
        )
        due = clock.now()
        set_cursor(schedule, due)
        call_command("run_scheduler", "--once", verbosity=0)
        # Its fire is planned (and run, or handed off).
        assert Run.objects.filter(schedule=schedule, plan_time=due).exists()


def test_an_integer_past_a_floats_range_is_refused_with_its_size():
    with pytest.raises(InvalidSetting, match="not an integer of 1025 bits"):
        parse("PLANNING_FAILURE_LIMIT", 2**1024)
