"""A budget for walking an RRULE with python-dateutil, so that no rule can pin a process.

dateutil looks for a rule's next fire period by period and stops only at a fire, or at the
year 9999: a rule none of whose periods holds a fire (``FREQ=SECONDLY;BYSETPOS=2``) is
searched for hours, and even ``UNTIL`` does not stop it, being checked on fires only.
A ``MeteredRule`` is a dateutil rule whose walk spends from a ``Budget`` as it goes: dateutil
reads the rule's ``_tzinfo`` once a period of an hourly or finer rule and its ``_byeaster``
once a month it moves to, so those reads are the meter. A walk that spends more steps or
CPU time than its budget raises ``RuleTooCostly``, an ``InvalidTrigger``: a validation
error where the rule is entered, and a failure of its own schedule only where it is planned.
A COUNT rule is counted ahead once, on a budget, to the UNTIL of its last fire
(``uncounted``), so that it need not be walked from its start to find a fire near now.
"""

from __future__ import annotations

import collections
import time
from datetime import datetime, timedelta
from typing import Any

from dateutil import rrule as du
from dateutil.relativedelta import relativedelta

from django_periodic.timing.triggers import InvalidTrigger

# What one search may cost: finding a rule's next fire, listing the fires to a time asked
# about, or sampling its first fires. A step is about a period's work for dateutil (1-4
# microseconds here), so a search stops within about a third of a second. A daily rule
# spends 10 steps a month, a yearly one 10 a year: a daily rule that fires less than once
# in 800 years is refused, a yearly one never.
SEARCH_STEPS = 100_000
# CPU time, not the clock: a process frozen mid-search (SIGSTOP, a paused VM) must not make
# a good rule look too costly. It bounds periods that cost more than a step (a secondly rule
# whose INTERVAL and BYHOUR/BYMINUTE/BYSECOND meet rarely costs dateutil 86,400 iterations
# a period).
SEARCH_SECONDS = 0.5
# A rule's period, where it has a fixed length (or a number of months): from any period
# on, the rule lists the same wall times when started there (without COUNT).
PERIODS = {
    du.WEEKLY: timedelta(weeks=1),
    du.DAILY: timedelta(days=1),
    du.HOURLY: timedelta(hours=1),
    du.MINUTELY: timedelta(minutes=1),
    du.SECONDLY: timedelta(seconds=1),
}
MONTHS = {du.MONTHLY: 1, du.YEARLY: 12}
# Reading the CPU clock costs about a sixth of a step: it is read every few steps.
_CLOCK_EVERY = 16
# The steps a walk spends when it moves to a month (a year, for a yearly rule), as dateutil's
# work there compares with a step's: a year's masks built, or a month of daily periods.
_STEPS_A_MOVE = {du.YEARLY: 10, du.DAILY: 10, du.WEEKLY: 5}


class RuleTooCostly(InvalidTrigger):
    """A search over a rule spent its budget without finding what it looked for."""


class Budget:
    """The steps and CPU seconds one search may spend."""

    def __init__(self, steps: int = SEARCH_STEPS, seconds: float = SEARCH_SECONDS) -> None:
        self._steps, self._seconds = steps, seconds
        self.renew()

    def renew(self) -> None:
        """Start a new search with the whole budget."""
        self.steps_left = self._steps
        self._deadline = time.thread_time() + self._seconds
        self._until_clock = _CLOCK_EVERY

    def spend(self, steps: int = 1) -> None:
        """Take ``steps`` from the budget; raise RuleTooCostly once it is spent."""
        self.steps_left -= steps
        self._until_clock -= 1
        if self._until_clock <= 0:
            self._until_clock = _CLOCK_EVERY
            if time.thread_time() > self._deadline:
                raise RuleTooCostly(too_costly())
        if self.steps_left < 0:
            raise RuleTooCostly(too_costly())


def too_costly() -> str:
    return (
        "This rule never fires, or fires too rarely to search: no fire was found in a "
        f"search of {SEARCH_STEPS:,} periods. Check that its BY parts can occur together."
    )


class MeteredRule(du.rrule):  # type: ignore[misc]  # dateutil's stubs are not installed
    """A dateutil rule whose walks spend from ``budget`` (None: unmetered)."""

    budget: Budget | None = None

    def _spend(self, steps: int) -> None:
        if self.budget is not None:
            self.budget.spend(steps)

    @property
    def _tzinfo(self) -> Any:  # read once a period of an hourly or finer rule
        self._spend(1)
        return self.__dict__["_metered_tzinfo"]

    @_tzinfo.setter
    def _tzinfo(self, value: Any) -> None:
        self.__dict__["_metered_tzinfo"] = value

    @property
    def _byeaster(self) -> Any:  # read once a month the walk moves to
        steps = _STEPS_A_MOVE.get(self._freq, 1)
        self._spend(steps if self._freq == du.YEARLY else max(1, steps // self._interval))
        return self.__dict__["_metered_byeaster"]

    @_byeaster.setter
    def _byeaster(self, value: Any) -> None:
        self.__dict__["_metered_byeaster"] = value


def metered(rule: du.rrule, **changes: Any) -> MeteredRule:
    """A MeteredRule equal to ``rule`` but for ``changes`` (as ``rrule.replace``, which
    would build a plain rule)."""
    parts = {
        "freq": rule._freq,
        "dtstart": rule._dtstart,
        "interval": rule._interval,
        "wkst": rule._wkst,
        "count": rule._count,
        "until": rule._until,
        **rule._original_rule,
        **changes,
    }
    return MeteredRule(**parts)


def uncounted(rule: du.rrule) -> du.rrule:
    """The rule with its COUNT made an UNTIL at its last fire: the same wall times, but
    listed from any period on, not only from DTSTART, so that its fires near now cost what
    a fire costs however old the rule is."""
    if rule._count is None:
        return rule
    return rule.replace(count=None, until=_last_fire(rule))


def _last_fire(rule: du.rrule) -> datetime | None:
    """The wall time of a COUNT rule's last fire (None: past datetime's last year): by
    arithmetic for a rule with one fire a period, else counted on one search's budget."""
    step = _fixed_step(rule)
    try:
        if step is not None:
            last_fire: datetime = rule._dtstart + step * (rule._count - 1)
            return last_fire
        walk = metered(rule)
        walk.budget = Budget()
        last = collections.deque(walk, maxlen=1)
        return last[0] if last else None
    except RuleTooCostly:
        raise InvalidTrigger(
            f"COUNT={rule._count} is more fires than can be counted ahead for this rule: "
            "give UNTIL instead."
        ) from None
    except (ValueError, OverflowError):
        return None


def _fixed_step(rule: du.rrule) -> timedelta | relativedelta | None:
    """The time between two fires of a rule that has one a period, every period (no BY
    part, and a day of the month that every month has); None for any other rule."""
    if any(rule._original_rule.values()):
        return None
    if rule._freq in PERIODS:
        return PERIODS[rule._freq] * rule._interval
    if rule._dtstart.day > 28:
        return None
    return relativedelta(months=MONTHS[rule._freq] * rule._interval)
