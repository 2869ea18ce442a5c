"""Single-fire overrides in the ledger: which a planning batch loads, and what one does to
the runs of a fire already planned (``Schedule.skip_fire()``, ``move_fire()``;
docs/overrides.md). The planner walks them as ``timing/overridden.py`` says.
"""

from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Exists, F, OuterRef, Q

from django_periodic import policies
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.conf import get_settings
from django_periodic.db import CONNECTION_ERRORS
from django_periodic.engine import overlap
from django_periodic.engine.runs import storable
from django_periodic.error_texts import error_text
from django_periodic.models import FireOverride, RunQuerySet
from django_periodic.timing import overridden

if TYPE_CHECKING:
    from django_periodic.engine.records import Due


def _from_cursor(cursor: F | OuterRef) -> Q:
    """The overrides the cursor has yet to meet: their fire or its new time is at or after
    it. Those before it were planned (or passed over) and stay as history."""
    return Q(plan_time__gte=cursor) | Q(move_to__gte=cursor)


# Whether a due schedule has overrides still to meet: an index probe per row (the unique
# index on schedule and plan time), so that schedules without cost nothing more.
HAS_OVERRIDES = Exists(
    FireOverride.objects.filter(_from_cursor(OuterRef("next_fire_at")), schedule_id=OuterRef("pk"))
)


def load(schedules: "list[Due]", using: str) -> None:
    """Give these schedules their overrides from their cursor on, in one query. Overrides
    that cannot be loaded fail the schedules that have them, never the batch."""
    if not schedules:
        return
    rows = FireOverride.objects.using(using).filter(
        _from_cursor(F("schedule__next_fire_at")), schedule_id__in=[s.pk for s in schedules]
    )
    found: dict[int, list[overridden.Override]] = {}
    try:
        fields = ("schedule_id", "plan_time", "move_to", "reason", "by")
        for schedule_id, plan_time, move_to, reason, by in rows.values_list(*fields):
            note = _storable(overridden.skip_note(reason, by)) if move_to is None else ""
            found.setdefault(schedule_id, []).append(overridden.Override(plan_time, move_to, note))
    except CONNECTION_ERRORS:
        raise
    except Exception as exc:
        for schedule in schedules:
            # What its trigger is built from could not be loaded, as with its calendars.
            schedule.calendar_error = f"Its overrides cannot be loaded ({error_text(exc)})."
        return
    for schedule in schedules:
        schedule.overrides = tuple(sorted(found.get(schedule.pk, ()), key=lambda o: o.plan_time))


def _storable(note: str) -> str:
    return storable.storable_text(note, get_settings().ERROR_MAX_CHARS)


def override_runs(runs: RunQuerySet, override: FireOverride, now: datetime) -> int:
    """Apply an override to the runs of its fire that have not started; return how many.

    Run in the caller's transaction. The guard is the one cancelling a waiting run uses: a
    conditional UPDATE of the runs still pending or queued at attempt 0. A worker that
    claimed one first keeps it (fewer rows change, and the caller refuses the override);
    one that comes after finds it skipped, or released at its new time.
    """
    waiting = runs.filter(status__in=(RunStatus.PENDING, RunStatus.QUEUED), attempt=0)
    if override.move_to is None:
        done = waiting.update(
            status=RunStatus.SKIPPED,
            error_code=ErrorCode.OVERRIDDEN,
            error_message=_storable(overridden.skip_note(override.reason, override.by)),
            next_retry_at=None,
            start_deadline=None,
            finished_at=now,
        )
        # A skipped pending run hands its slot to the oldest queued one, as a cancel does.
        overlap.promote_queued(runs.db, [override.schedule_id])
        return done
    grace = override.schedule.misfire_grace
    deadline = policies.start_deadline(grace, override.move_to, now)
    return waiting.update(release_at=override.move_to, start_deadline=deadline)
