"""The schedules' queryset vocabulary (``enabled``, ``due``, ``paused``, ``of_kind``, ...), and
the updates that keep a row's revision and cursor right when they bypass ``save()``
(``update``, ``reschedule``). ``Schedule.objects`` is a ``ScheduleQuerySet``."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import F

from django_periodic.choices import ScheduleKind
from django_periodic.db import clock
from django_periodic.models import alerting, pausing
from django_periodic.models.changes import versioning
from django_periodic.models.field_groups import REVISION_FIELDS
from django_periodic.models.saving import wake_schedulers
from django_periodic.models.trigger_rows import KIND_FILTERS

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule  # noqa: F401 (the base's type argument)


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def enabled(self) -> "ScheduleQuerySet":
        """Schedules the planner looks at (not paused or disabled)."""
        return self.filter(enabled=True)

    def with_alerts(self) -> "ScheduleQuerySet":
        """Schedules whose alerts the scheduler judges: enabled, with at least one set."""
        return self.filter(alerting.WITH_ALERTS)

    def paused(self, now: datetime) -> "ScheduleQuerySet":
        """Schedules a pause holds at ``now`` (``Schedule.is_paused``, models/pausing.py)."""
        return self.filter(pausing.paused(now))

    def needing_attention(self) -> "ScheduleQuerySet":
        """Schedules the scheduler last found needing attention (models/alerting.py)."""
        return self.exclude(attention_reason="")

    def of_kind(self, kind: str) -> "ScheduleQuerySet":
        """Schedules whose trigger is of this ``Schedule.Kind``."""
        return self.filter(KIND_FILTERS[ScheduleKind(kind)])

    def due(self, now: datetime) -> "ScheduleQuerySet":
        """Enabled schedules whose cursor has reached ``now``, the most overdue first."""
        return self.filter(enabled=True, next_fire_at__lte=now).order_by("next_fire_at", "pk")

    def update(self, **kwargs: Any) -> int:
        """Update these rows; writing any of ``REVISION_FIELDS`` bumps their revision.

        Bumped in the same statement, changed value or not (the database would have to
        compare every field to tell), so ``bulk_update()`` of those fields bumps too.
        """
        if "revision" not in kwargs and not kwargs.keys().isdisjoint(REVISION_FIELDS):
            kwargs["revision"] = F("revision") + 1
        return super().update(**kwargs)

    # update() that records a version of each row it changes (docs/versions.md): defined in
    # models/changes/versioning.py, set here by name.
    update_versioned = versioning.update_versioned

    def reschedule(self, now: datetime | None = None) -> int:
        """Recompute the cursor of these schedules from ``now`` (after edits that bypass save())."""
        now = now or clock.now(self.db)
        changed = []
        for schedule in self.prefetch_related("calendars").iterator(chunk_size=2000):
            if schedule.trigger_kind == ScheduleKind.ONCE and schedule.next_fire_at is None:
                continue  # a fired one-shot stays fired
            # One that has run its max_runs fires stays ended (models/lifecycle.py).
            schedule.next_fire_at = None if schedule.has_ended else schedule.first_fire_time(now)
            changed.append(schedule)
        updated = self.model.objects.using(self.db).bulk_update(changed, ["next_fire_at"])
        if updated:
            wake_schedulers(self.db)
        return updated
