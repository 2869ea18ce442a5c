"""Pausing a schedule for a while, with a reason: its rules and how a pause reads.

A paused schedule keeps its cursor; the planner, finding it due before ``paused_until``,
records one skipped run (code ``paused``, with ``pause_note()`` as its message) and moves
the cursor to the first fire at or after the pause's end: no fire of the pause is run, and
none is caught up (engine/decisions.py).
"""

from datetime import datetime
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError

from django_periodic import bounds

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule

PAUSE_REASON_MAX_LENGTH = 500


def pause_note(until: datetime, reason: str, by: str) -> str:
    """A pause in words: until when (UTC), by whom, why."""
    who = f" by {by}" if by else ""
    why = f": {reason}" if reason else ""
    return f"Paused until {until:%Y-%m-%d %H:%M:%S} UTC{who}{why}"


def until_error(until: datetime | None, now: datetime) -> str | None:
    """Why a pause cannot end at ``until``: it must end after ``now``, in range."""
    if until is None or until <= now:
        return f"A pause ends in the future (now: {now:%Y-%m-%d %H:%M:%S} UTC)."
    return bounds.SCHEDULE["paused_until"].error("paused_until", until)


def check(schedule: "Schedule", now: datetime) -> None:
    """Raise ValidationError for a new pause that cannot hold: one that ends by ``now``,
    ends out of range, or has no reason. Only the pause is checked: a schedule whose other
    fields are bad (its job gone, say) may be paused all the same."""
    errors = {}
    if message := until_error(schedule.paused_until, now):
        errors["paused_until"] = message
    if not schedule.pause_reason.strip():
        errors["pause_reason"] = "A pause needs its reason."
    elif len(schedule.pause_reason) > PAUSE_REASON_MAX_LENGTH:
        errors["pause_reason"] = f"A reason has at most {PAUSE_REASON_MAX_LENGTH} characters."
    if errors:
        raise ValidationError(errors)
