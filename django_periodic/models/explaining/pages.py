"""Which fires one call of ``Schedule.explain()`` or ``explain_page()`` reads: a window of
times, checked before anything is computed from it, and the part of it read at once (a
page, or a whole window up to ``MAX_FIRES``), found from the trigger's fires and the runs'
plan times alone, each counted up to one past the most it may hold (docs/explain.md)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django_periodic import choices
from django_periodic.models.explaining.accounts import FireAccount
from django_periodic.models.run import RunQuerySet
from django_periodic.models.schedule_fields import ScheduleFields
from django_periodic.models.trigger_rows import trigger_of
from django_periodic.timing import bounds, triggers

# The fires of one page (``explain_page()``, the admin's Explain page): a page to read,
# computed while its reader waits. The default window, the last 24 hours, of a schedule
# firing every minute (the most a cron fires) is one page.
PAGE_SIZE = 1_440
# The most fires one call of ``explain()`` gives for a whole window, in one list: past it,
# read the window by pages.
MAX_FIRES = 100_000
# The end of a window, excluded from it: the end of the range of times may end one.
_WINDOW_END = bounds.Range(bounds.EARLIEST, bounds.LATEST)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class ExplainPage:
    """A page of ``Schedule.explain_page()``: the accounts of the first ``PAGE_SIZE`` fires
    of the window ``[since, until)`` after ``after`` (None: from ``since``), in order.

    ``next_after`` is where the next page continues: the last time this page covers, to be
    passed as its ``after``. None: this page ends the window.
    """

    since: datetime
    until: datetime
    after: datetime | None
    accounts: tuple[FireAccount, ...]
    next_after: datetime | None


def check_window(since: datetime, until: datetime, after: datetime | None = None) -> None:
    """Raise ValueError, saying why, unless ``[since, until)`` is a window of aware times in
    the range every time keeps (``bounds.TIMES``) and ``after``, if given, such a time too:
    out of it, a time cannot be shifted to UTC or stepped from (OverflowError)."""
    for name, moment, allowed in (
        ("since", since, bounds.TIMES),
        ("until", until, _WINDOW_END),
        ("after", after, bounds.TIMES),
    ):
        if error := allowed.error(name, moment):
            raise ValueError(error)
    if until <= since:
        raise ValueError("until must come after since.")


@dataclass(frozen=True)
class Part:
    """The part of a window one call explains, ``[start, stop)``: the nominal fires in it (the
    trigger before its calendars and its ``start_at`` / ``end_at``, whose fires are accounted
    for as out of bounds) and, if the window goes on, the last time it covers."""

    start: datetime
    stop: datetime
    fires: list[datetime]
    next_after: datetime | None

    @classmethod
    def find(
        cls,
        schedule: ScheduleFields,
        since: datetime,
        until: datetime,
        after: datetime | None,
        scope: str | None,
        most: int,
    ) -> "Part":
        """The window's first ``most`` times after ``after``: its fires and the plan times of
        its runs (a run of an earlier trigger has an account of its own), each found up to
        one more than ``most``, to know whether the window goes on."""
        start = since if after is None or after < since else after + _MICROSECOND
        fires = _fires(schedule, start, until, most + 1)
        runs = ledger_runs(schedule, scope).filter(plan_time__gte=start, plan_time__lt=until)
        planned = runs.order_by("plan_time").values_list("plan_time", flat=True).distinct()
        times = sorted({*fires, *planned[: most + 1]})
        if len(times) <= most:
            return cls(start, until, fires, None)
        stop = times[most]
        return cls(start, stop, [fire for fire in fires if fire < stop], times[most - 1])


def _fires(schedule: ScheduleFields, start: datetime, until: datetime, most: int) -> list[datetime]:
    """The first ``most`` nominal fires of the schedule in ``[start, until)``."""
    bounded = trigger_of(schedule)
    assert isinstance(bounded, triggers.BoundedTrigger)  # what trigger_of builds
    trigger = triggers.BoundedTrigger(bounded.trigger)  # within time's bounds only
    # [start, until): times are whole microseconds.
    return triggers.fire_times(trigger, most, start - _MICROSECOND, until - _MICROSECOND)


def ledger_runs(schedule: ScheduleFields, scope: str | None) -> RunQuerySet:
    """The runs of its fires (not manual ones), of one scope if named."""
    runs: RunQuerySet = schedule.runs.using(schedule._state.db or "default")
    runs = runs.filter(trigger__in=choices.LEDGER_TRIGGERS)
    return runs if scope is None else runs.filter(scope=scope)
