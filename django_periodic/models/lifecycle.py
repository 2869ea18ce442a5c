"""A schedule's lifecycle: when it ends (``max_runs``), whether it fires once on creation
(``fire_on_create``) and when it pauses itself (``pause_after_failures``); docs/policies.md,
"Lifecycle".

The rules read by more than one layer live here: how many fires a schedule has left
(``runs_left``; the planner caps its decisions by it, save() ends or resumes its cursor by
it) and when a save fires it once (``fires_on_save``).
"""

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_periodic.choices import ScheduleKind
from django_periodic.error_texts import error_text
from django_periodic.escaping import escaped

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule

logger = logging.getLogger("django_periodic")


def runs_left(max_runs: int | None, fire_count: int) -> int | None:
    """How many more fires may run (0: it has ended); None: no limit."""
    return None if max_runs is None else max(max_runs - fire_count, 0)


class Lifecycle(models.Model):
    """The lifecycle fields of ``Schedule`` (``field_groups.LIFECYCLE_FIELDS``), and the
    count of fires that ``max_runs`` reads."""

    max_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("It stops after this many fires have run; empty: no limit."),
    )
    fire_count = models.PositiveIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text=_("Its fires planned to run so far, which max_runs counts."),
    )
    fire_on_create = models.BooleanField(
        default=False,
        db_default=False,
        help_text=_("A new or re-enabled schedule fires once at once."),
    )
    pause_after_failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("It pauses itself after this many failed runs in a row; empty: never."),
    )

    class Meta:
        abstract = True

    @property
    def has_ended(self) -> bool:
        """Whether it has run its ``max_runs`` fires: it has no next fire until
        ``max_runs`` is raised or cleared."""
        return runs_left(self.max_runs, self.fire_count) == 0

    @property
    def runs_note(self) -> str:
        """Its fires run so far, in words: "3 of 10 runs", "ended: ran 10 of 10 runs"."""
        if self.max_runs is None:
            return f"{self.fire_count} run(s)"
        counted = f"{self.fire_count} of {self.max_runs} runs"
        return f"ended: ran {counted}" if self.has_ended else counted


def errors(schedule: "Schedule") -> list[tuple[str, str]]:
    """The lifecycle fields that make no sense for this schedule (``Schedule.clean()``)."""
    if schedule.max_runs is not None and schedule.trigger_kind == ScheduleKind.ONCE:
        return [("max_runs", "A one-shot (run_at) fires once: max_runs does not apply.")]
    return []


def fires_on_save(schedule: "Schedule", update_fields: Iterable[str] | None) -> bool:
    """Whether this save fires it once (``fire_on_create``): it is new, or enabled again
    (``enabled`` written, False before), and it is enabled and has not ended. Read
    before the save, which forgets what the row held."""
    if not (schedule.fire_on_create and schedule.enabled) or schedule.has_ended:
        return False
    if schedule._state.adding:
        return True
    if update_fields is not None and "enabled" not in update_fields:
        return False
    loaded = getattr(schedule, "_loaded_trigger", None) or {}
    return loaded.get("enabled") is False


def fire_once(schedule: "Schedule") -> None:
    """The fire of ``fire_on_create``: a manual run now (``run_now()``; every scope of a
    fanned-out schedule), under its overlap policy. A manual run is not one of the
    trigger's plan times, so it never takes one's place, and ``max_runs`` does not count
    it. A scope provider that fails is logged: the schedule is saved all the same."""
    try:
        schedule.run_now_for_all_scopes()
    except Exception as exc:  # app code (a scope provider): the save stands
        message = escaped(error_text(exc))
        logger.error("Schedule %r did not fire on creation: %s", schedule.name, message)
