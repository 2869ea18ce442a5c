"""What saving a schedule does besides writing its row: where it moves the cursor, which
fields a save of the whole row writes, and waking the schedulers when the cursor moved.
``Schedule.save()`` calls these; ``ScheduleQuerySet.reschedule()`` wakes them too."""

from typing import TYPE_CHECKING, Any

from django_periodic.choices import ScheduleKind
from django_periodic.db import clock, notifications
from django_periodic.models.field_groups import ATTENTION_FIELDS

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule


def wake_schedulers(using: str) -> None:
    """Tell sleeping schedulers that a cursor moved (a NOTIFY on PostgreSQL, on commit)."""
    notifications.notify(using)


def writes_every_field(schedule: "Schedule", kwargs: dict[str, Any]) -> bool:
    """Whether a save with these ``kwargs`` would UPDATE every field of the existing row."""
    same_database = kwargs.get("using") in (None, schedule._state.db)
    return not schedule._state.adding and same_database and not kwargs.get("force_insert")


def edited_fields(schedule: "Schedule") -> list[str]:
    """Every loaded field but ``ATTENTION_FIELDS``, which only the scheduler writes: an
    edit saved from a form loaded before a transition must not undo it."""
    deferred = schedule.get_deferred_fields()
    return [
        field.name
        for field in schedule._meta.concrete_fields
        if not field.primary_key
        and field.name not in ATTENTION_FIELDS
        and field.attname not in deferred
    ]


def move_cursor(schedule: "Schedule", using: str) -> bool:
    """Set ``next_fire_at`` after a change that affects it; return whether it moved.

    A new schedule, an edited trigger and a resumed schedule (enabled again, or its
    pause ended) restart from now (time spent paused is not a misfire). Disabling and
    pausing keep the cursor, and a one-shot keeps it unless ``run_at`` changed, so that
    a fired one-shot can never fire again. One that has run its ``max_runs`` fires has
    none (models/lifecycle.py); raising or clearing ``max_runs`` resumes it from now.
    """
    changed = schedule._changed_cursor_fields()
    if not schedule._state.adding:
        if not changed or (changed == {"enabled"} and not schedule.enabled):
            return False
        if changed == {"paused_until"} and schedule.paused_until is not None:
            return False  # pausing: the planner skips the fires of the pause
        if schedule.trigger_kind == ScheduleKind.ONCE and "run_at" not in changed:
            return False
        going_on = schedule.next_fire_at is not None and not schedule.has_ended
        if changed == {"max_runs"} and going_on:
            return False  # a new limit not reached yet: its fires go on as planned
    now = clock.now(using)
    if schedule._state.adding:
        schedule.created_at = now  # an interval's anchor: the database's clock, like all times
    schedule.next_fire_at = None if schedule.has_ended else schedule.first_fire_time(now)
    return True
