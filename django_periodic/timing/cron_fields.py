"""A cron expression's five fields: their ranges, names and macros, the values of one item,
and the plain numeric expression croniter is given.

Pure: no Django, no database. The expression as a whole is parsed and validated in
timing/triggers.py, which turns a FieldError into InvalidTrigger naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The cron macros and the five fields each stands for.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# (name, low, high, names); day-of-week allows 7 for Sunday, as in Vixie cron.
FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {n: i + 1 for i, n in enumerate(_MONTHS)}),
    ("day-of-week", 0, 7, {n: i for i, n in enumerate(_WEEKDAYS)}),
)
MONTH_LENGTHS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # Feb 29 exists sometimes
_UNSUPPORTED = {  # croniter extensions, refused so that schedules stay portable cron
    "?": "'?' is not supported; use '*'",
    "#": "'#' (nth weekday) is not supported",
    "l": "'L' (last) is not supported",
    "w": "'W' (nearest weekday) is not supported",
    "h": "'H' (hashed) is not supported",
}
_DIGITS = re.compile(r"[0-9]+")


class FieldError(Exception):
    """Reason an item of one field is invalid; turned into InvalidTrigger naming the field."""


@dataclass(frozen=True)
class CronSpec:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0-6, Sunday = 0
    days_and: bool  # Vixie: a day field starting with '*' makes both day fields required
    fixed_time: bool  # Debian DST rule: follows the wall clock rather than real time


def _number(digits: str, low: int, high: int) -> int:
    """The number ``digits`` spell, within ``low``-``high``. Judged on its length first:
    int() refuses over 4300 digits, and no field's numbers have more than two."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(high)) or not low <= int(significant) <= high:
        shown = significant if len(significant) <= 12 else f"a number of {len(significant)} digits"
        raise FieldError(f"{shown} is out of range {low}-{high}")
    return int(significant)


def _value(text: str, item: str, low: int, high: int, names: dict[str, int]) -> int:
    if _DIGITS.fullmatch(text):
        return _number(text, low, high)
    if text.lower() in names:
        return names[text.lower()]
    for char, reason in _UNSUPPORTED.items():
        if char in item.lower():
            raise FieldError(reason)
    if not text:
        raise FieldError(f"'{item}' is malformed")
    raise FieldError(f"unknown name '{text}'" if names else f"'{text}' is not a number")


def step(text: str, low: int, high: int) -> int:
    """The step written after a slash in a field from ``low`` to ``high``: at least 1. A
    step past the field's span picks the first value alone, as the span itself does: one
    longer than the span's digits is read as the span (int() refuses over 4300 digits)."""
    if not _DIGITS.fullmatch(text):
        raise FieldError(f"step '{text}' is not a number")
    significant = text.lstrip("0")
    if not significant:
        raise FieldError("step must be at least 1")
    span = high - low + 1
    return int(significant) if len(significant) <= len(str(span)) else span


def item_values(item: str, low: int, high: int, names: dict[str, int]) -> range:
    base, slash, step_text = item.partition("/")
    every = step(step_text, low, high) if slash else 1
    if base == "*":
        return range(low, high + 1, every)
    first_text, dash, last_text = base.partition("-")
    first = _value(first_text, item, low, high, names)
    last = _value(last_text, item, low, high, names) if dash else (high if slash else first)
    if first > last:
        raise FieldError(f"range {first_text}-{last_text} is reversed")
    return range(first, last + 1, every)


def compact(values: frozenset[int], low: int, high: int) -> str:
    return "*" if len(values) == high - low + 1 else ",".join(map(str, sorted(values)))


def croniter_args(spec: CronSpec) -> tuple[str, bool]:
    """Plain numeric expression plus day_or flag, so croniter's own parsing quirks never matter."""
    dom, dow = compact(spec.days, 1, 31), compact(spec.weekdays, 0, 6)
    day_or = not spec.days_and
    if day_or and "*" in (dom, dow):
        dom = dow = "*"  # OR with a field that covers every day
    elif day_or and min(spec.days) > max(MONTH_LENGTHS[m - 1] for m in spec.months):
        # e.g. '31 2 mon': the day-of-month side never occurs; croniter would search 50 years
        # for it on every call before settling for the weekdays.
        dom, day_or = "*", False
    fields = (compact(spec.minutes, 0, 59), compact(spec.hours, 0, 23), dom)
    return " ".join((*fields, compact(spec.months, 1, 12), dow)), day_or
