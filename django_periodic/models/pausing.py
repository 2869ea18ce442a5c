"""Pausing a schedule for a while, with a reason: its rules and how a pause reads.

A paused schedule keeps its cursor; the planner, finding it due before ``paused_until``,
records one skipped run (code ``paused``, with ``pause_note()`` as its message) and moves
the cursor to the first fire at or after the pause's end: no fire of the pause is run, and
none is caught up (engine/planning/decisions.py). Pausing and resuming are refused, as a
``ValidationError``, when the schedule's calendars leave it no fire within reach after then.
"""

from datetime import UTC, datetime, timedelta

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.functions import Now

from django_periodic.db import clock
from django_periodic.models import versions as versioning
from django_periodic.models.calendars import closures_of, next_fire_error
from django_periodic.models.schedule_fields import PAUSE_FIELDS, ScheduleFields
from django_periodic.models.schedule_fields import (
    PAUSE_REASON_MAX_LENGTH as PAUSE_REASON_MAX_LENGTH,
)
from django_periodic.timing import bounds, triggers

_MICROSECOND = timedelta(microseconds=1)
# A pause that holds until someone resumes it (pause_after_failures, docs/policies.md):
# a day before LATEST, within the paused_until CHECK, with a fire after it within reach.
UNTIL_RESUMED = bounds.LATEST - timedelta(days=1)


def holds(paused_until: datetime | None, now: datetime) -> bool:
    """Whether a pause ending at ``paused_until`` holds a schedule's fires at ``now``: from
    ``paused_until`` on, it no longer does (``paused(now)`` selects the same rows)."""
    return paused_until is not None and paused_until > now


def paused(now: datetime | Now) -> Q:
    """The schedules a pause holds at ``now`` (``holds``, as a query; ``Now()``: at the
    database's clock)."""
    return Q(paused_until__gt=now)


# How a pause's skipped run names its end: pause_note() writes it, pause_end() reads it back.
_NOTE_END = "%Y-%m-%d %H:%M:%S"
_NOTE_PREFIX = "Paused until "
_UNTIL_RESUMED_TEXT = "until resumed"


def until_text(until: datetime) -> str:
    """When a pause ends, in words: "until resumed" (``UNTIL_RESUMED``), else "until" and
    its time (UTC)."""
    if until >= UNTIL_RESUMED:
        return _UNTIL_RESUMED_TEXT
    return f"until {until:{_NOTE_END}} UTC"


def pause_note(until: datetime, reason: str, by: str) -> str:
    """A pause in words: until when (UTC), by whom, why."""
    who = f" by {by}" if by else ""
    why = f": {reason}" if reason else ""
    return f"Paused {until_text(until)}{who}{why}"


def pause_end(note: str) -> datetime | None:
    """The end of the pause a skipped run's ``pause_note()`` names (to the second, UTC), or
    None for a note that is not one: explain() expands a pause's span fire by fire from it."""
    if note.startswith(f"Paused {_UNTIL_RESUMED_TEXT}"):
        return UNTIL_RESUMED
    if not note.startswith(_NOTE_PREFIX):
        return None
    text = note[len(_NOTE_PREFIX) :].split(" UTC", 1)[0]
    try:
        return datetime.strptime(text, _NOTE_END).replace(tzinfo=UTC)
    except ValueError:
        return None


def until_error(until: datetime | None, now: datetime) -> str | None:
    """Why a pause cannot end at ``until``: it must end after ``now``, in range."""
    if until is None or until <= now:
        return f"A pause ends in the future (now: {now:%Y-%m-%d %H:%M:%S} UTC)."
    return bounds.SCHEDULE["paused_until"].error("paused_until", until)


def check(schedule: ScheduleFields, now: datetime) -> None:
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
    if "paused_until" not in errors and (message := _after_pause_error(schedule)):
        errors["paused_until"] = message
    if errors:
        raise ValidationError(errors)


def check_resume(schedule: ScheduleFields, now: datetime) -> None:
    """Raise ValidationError (on ``calendars``) when a resumed schedule would have no next
    fire within reach under its calendars: it goes on from its first fire after ``now``."""
    if message := _calendar_error(schedule, now):
        raise ValidationError({"calendars": message})


def _after_pause_error(schedule: ScheduleFields) -> str | None:
    """Why the first fire at or after the pause's end, where the planner moves the cursor,
    cannot be found under its calendars, or None."""
    assert schedule.paused_until is not None  # until_error() refuses a pause without an end
    return _calendar_error(schedule, schedule.paused_until - _MICROSECOND)


def _calendar_error(schedule: ScheduleFields, after: datetime) -> str | None:
    try:
        closures = closures_of(schedule)
    except triggers.InvalidTrigger:
        return None  # a bad calendar fails the schedule when due, paused or not
    return next_fire_error(schedule, closures, after)


class Pausing(ScheduleFields):
    """Pausing and resuming a schedule (docs/pause.md): ``pause()``, ``resume()``,
    ``is_paused()``."""

    class Meta:
        abstract = True

    def is_paused(self, now: datetime) -> bool:
        """Whether a pause holds its fires at ``now``."""
        return holds(self.paused_until, now)

    def pause(self, until: datetime, reason: str, *, by: str = "") -> None:
        """Pause until ``until``: its fires before then are not run (one skipped run, code
        ``paused``, says so), and then it goes on from its next fire, without catching up.
        ``by`` names who paused it. Raises ValidationError for a pause that ends in the
        past or out of range, or without a reason."""
        self.paused_until, self.pause_reason, self.paused_by = until, reason, by
        check(self, clock.now(self._state.db or "default"))
        with versioning.changed_by(by or versioning.author().by, reason):  # its version's
            self.save(update_fields=[*PAUSE_FIELDS, "updated_at"])

    def resume(self, *, by: str = "", reason: str = "") -> None:
        """End a pause now: the schedule goes on from its first fire after now. Raises
        ValidationError when its calendars would leave it no fire within reach. ``by`` and
        ``reason`` are its version's (docs/versions.md)."""
        check_resume(self, clock.now(self._state.db or "default"))
        self.paused_until, self.pause_reason, self.paused_by = None, "", ""
        with versioning.changed_by(by or versioning.author().by, reason or "Resumed."):
            self.save(update_fields=[*PAUSE_FIELDS, "updated_at"])
