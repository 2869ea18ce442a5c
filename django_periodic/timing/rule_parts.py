"""What a parsed RRULE's BY parts must be before it is walked: each in its range, and able
to occur together. A rule failing these has no fire, which only a walk to the year 9999
would otherwise find out; the rules decided here are those where the answer is exact (the
rest are left to the bounded search of ``rule_search``).
"""

from __future__ import annotations

from collections.abc import Iterable

from dateutil import rrule as du

from django_periodic.timing.triggers import InvalidTrigger

_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# The days a period of each frequency can hold: BYSETPOS picks among their fires.
_DAYS_A_PERIOD = {du.YEARLY: 366, du.MONTHLY: 31, du.WEEKLY: 7}
# The range of each BY part's values, as RFC 5545 allows them (a leap second, 60, is
# refused: no clock here has one).
_RANGES = {
    "BYSECOND": (0, 59),
    "BYMINUTE": (0, 59),
    "BYHOUR": (0, 23),
    "BYMONTH": (1, 12),
    "BYMONTHDAY": (1, 31),
    "BYYEARDAY": (1, 366),
    "BYWEEKNO": (1, 53),
    "BYSETPOS": (1, 366),
}
_SIGNED = {"BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYSETPOS"}


def check(rule: du.rrule) -> None:
    """Raise InvalidTrigger for a BY part out of range, or BY parts that never meet."""
    for name, values in _parts(rule).items():
        _check_range(name, values)
    _check_month_days(rule)
    _check_year_days(rule)
    _check_nth_weekdays(rule)
    _check_set_positions(rule)


def _parts(rule: du.rrule) -> dict[str, tuple[int, ...]]:
    """The BY parts the text gave, by their RFC 5545 names."""
    given = rule._original_rule
    return {
        name: tuple(given[key])
        for name in _RANGES
        if (key := name.lower()) in given and given[key] is not None
    }


def _check_range(name: str, values: Iterable[int]) -> None:
    low, high = _RANGES[name]
    for value in values:
        in_range = low <= abs(value) <= high if name in _SIGNED else low <= value <= high
        if not in_range:
            allowed = f"{low} to {high}" + (f", or -{high} to -{low}" if name in _SIGNED else "")
            raise InvalidTrigger(f"{name}={value} is out of range: it takes {allowed}.")


def _check_month_days(rule: du.rrule) -> None:
    """Its days of the month occur in one of its months."""
    days = (*rule._bymonthday, *(-day for day in rule._bynmonthday))
    months = rule._bymonth or range(1, 13)
    if days and min(days) > max(_MONTH_DAYS[month - 1] for month in months):
        raise InvalidTrigger(_never("its days of the month do not occur in its months"))


def _check_year_days(rule: du.rrule) -> None:
    """Its days of the year fall in one of its months, in a leap year or another."""
    if not (rule._byyearday and rule._bymonth):
        return
    for year_length in (365, 366):
        for day in rule._byyearday:
            index = day - 1 if day > 0 else year_length + day
            if 0 <= index < year_length and _month_of(index, year_length) in rule._bymonth:
                return
    raise InvalidTrigger(_never("its days of the year do not fall in its months"))


def _month_of(index: int, year_length: int) -> int:
    """The month (1-12) of the day ``index`` (from 0) of a year of ``year_length`` days."""
    for month, days in enumerate(_MONTH_DAYS, start=1):
        days -= month == 2 and year_length == 365
        if index < days:
            return month
        index -= days
    raise AssertionError(index)


def _check_nth_weekdays(rule: du.rrule) -> None:
    """An nth weekday (BYDAY=5MO) within its month's or year's count of that weekday."""
    if not rule._bynweekday:  # set for a monthly or yearly rule only
        return
    in_month = rule._freq == du.MONTHLY or bool(rule._bymonth)
    most = 5 if in_month else 53
    if min(abs(nth) for _, nth in rule._bynweekday) > most:
        span = "month" if in_month else "year"
        raise InvalidTrigger(_never(f"a {span} holds at most {most} of each weekday"))


def _check_set_positions(rule: du.rrule) -> None:
    """BYSETPOS picks among a period's fires: some position is within as many as it holds."""
    if not rule._bysetpos:
        return
    most = _DAYS_A_PERIOD.get(rule._freq, 1) * _times_a_day(rule)
    if min(abs(position) for position in rule._bysetpos) > most:
        raise InvalidTrigger(
            _never(f"a period of this frequency holds at most {most} fires for BYSETPOS to pick")
        )


def _times_a_day(rule: du.rrule) -> int:
    """The times of day a period of its frequency lists for one day."""
    if rule._freq < du.HOURLY:
        return len(rule._timeset)
    counts = {du.HOURLY: (rule._byminute, rule._bysecond), du.MINUTELY: (rule._bysecond,)}
    total = 1
    for values in counts.get(rule._freq, ()):
        total *= len(values)
    return total


def _never(reason: str) -> str:
    return f"This rule never fires: {reason}."
