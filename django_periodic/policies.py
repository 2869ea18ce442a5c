"""Misfire and overlap decisions: pure functions of a schedule's policy and what it has in flight.

No database here: the planner (for due fires) and the models (for ``run_now()`` and
retries) feed these the rows they have locked, so both decide by the same rules.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from django_periodic.choices import ErrorCode, Misfire, Overlap, RunStatus
from django_periodic.timing import bounds


class Policy(Protocol):
    """The schedule fields the decisions read (a ``Schedule`` is one)."""

    overlap: str
    max_queued: int
    max_concurrent: int | None
    misfire: str
    misfire_grace: timedelta


@dataclass
class Occupancy:
    """What a schedule already has in flight when new fires arrive."""

    active: int = 0  # runs pending or running
    queued: int = 0
    retrying: bool = False


def is_exclusive(overlap: str) -> bool:
    """Whether a schedule's runs hold its one active slot (all but "concurrent")."""
    return overlap != Overlap.CONCURRENT


def shifted(at: datetime, by: timedelta) -> datetime:
    """``at + by``, held within the range of stored times (``bounds``): a deadline past
    either end is as good as that end, and a row's duration, however large, never
    overflows the arithmetic."""
    if by >= bounds.LATEST - at:
        return bounds.LATEST
    if by <= bounds.EARLIEST - at:
        return bounds.EARLIEST
    return at + by


def start_deadline(misfire_grace: timedelta, plan_time: datetime, now: datetime) -> datetime | None:
    """When a pending fire is skipped if no worker has started it: a grace after it is due.

    Counted from ``now`` for a fire made late by the misfire policy, so it gets a grace too.
    None (no deadline) for a grace that reaches past every time a row may hold.
    """
    deadline = shifted(max(plan_time, now), misfire_grace)
    return None if deadline == bounds.LATEST else deadline


def finish_by(plan_time: datetime, finish_within: timedelta | None) -> datetime | None:
    """A run's deadline to finish (``Schedule.finish_within``): late if still unfinished
    then, whatever held it back; None: no deadline.

    Raises ValueError for a ``finish_within`` out of its range (a row stored past its
    CHECK): the run's schedule fails to plan, alone."""
    if finish_within is None:
        return None
    error = bounds.SCHEDULE["finish_within"].error("finish_within", finish_within)
    if error:
        raise ValueError(error)
    return shifted(plan_time, finish_within)


def misfire_deadline(misfire_grace: timedelta, now: datetime) -> datetime:
    """Plan times before this are late at ``now``: older than the misfire grace."""
    if misfire_grace >= now - bounds.EARLIEST:
        return bounds.EARLIEST  # and -misfire_grace might not even be a timedelta
    return shifted(now, -misfire_grace)


def overlap_status(policy: Policy, occupancy: Occupancy) -> tuple[str, str]:
    """(status, skip reason) of a new fire given what is in flight; updates ``occupancy``."""
    if policy.overlap == Overlap.CONCURRENT:
        cap = policy.max_concurrent
        free = cap is None or occupancy.active < cap
    else:
        free = not occupancy.active
    if free:
        occupancy.active += 1
        return RunStatus.PENDING, ""
    if policy.overlap == Overlap.QUEUE:
        if occupancy.queued < policy.max_queued:
            occupancy.queued += 1
            return RunStatus.QUEUED, ""
        return RunStatus.SKIPPED, ErrorCode.QUEUE_FULL
    return RunStatus.SKIPPED, ErrorCode.OVERLAP  # skip, and any unknown value


def supersedes_retry(in_flight: Occupancy, statuses: Iterable[str]) -> bool:
    """Whether new fires end the run of their scope waiting to retry: a newer fire that
    runs or waits (not one skipped) replaces it."""
    return in_flight.retrying and any(status != RunStatus.SKIPPED for status in statuses)


# The one skipped row that stands for missed times not listed one by one (too many to
# list: decisions.py): missed_span_note() writes its message, missed_span_end() reads it back.
_MISSED_SPAN = "Missed, as was every plan time after it up to "
_MISSED_SPAN_END = "%Y-%m-%d %H:%M:%S"


def missed_span_note(latest: datetime) -> str:
    """The message of the row that stands for every missed time after it, up to ``latest``."""
    return f"{_MISSED_SPAN}{latest:{_MISSED_SPAN_END}}."


def missed_span_end(message: str) -> datetime | None:
    """The ``latest`` a ``missed_span_note()`` names (to the second, UTC), or None."""
    if not message.startswith(_MISSED_SPAN):
        return None
    try:
        text = message[len(_MISSED_SPAN) :].rstrip(".")
        return datetime.strptime(text, _MISSED_SPAN_END).replace(tzinfo=UTC)
    except ValueError:
        return None


def misfire_marks(
    policy: Policy, due: list[datetime], now: datetime, catchup_limit: int
) -> Iterator[tuple[datetime, bool]]:
    """Yield (plan_time, missed) for each due time under the schedule's misfire policy."""
    deadline = misfire_deadline(policy.misfire_grace, now)
    if not any(t < deadline for t in due):
        return ((t, False) for t in due)
    if policy.misfire == Misfire.ALL:
        return ((t, i >= catchup_limit) for i, t in enumerate(due))
    if policy.misfire == Misfire.SKIP:
        return ((t, t < deadline) for t in due)
    return ((t, t != due[-1]) for t in due)  # latest, the default
