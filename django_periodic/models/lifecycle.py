"""A schedule's lifecycle: when it ends (``max_runs``), whether it fires once on creation
(``fire_on_create``) and when it pauses itself (``pause_after_failures``); docs/policies.md,
"Lifecycle".

The rule read by more than one layer lives here: how many fires a schedule has left
(``runs_left``; the planner caps its decisions by it, save() ends or resumes its cursor by
it, explain and the fire diff stop at it). When a save fires it once (``fires_on_save``)
is in models/schedule.py, beside ``save()``; what ``clean()`` refuses, in
models/validation.py.
"""

from django.db import models
from django.utils.translation import gettext_lazy as _


def runs_left(max_runs: int | None, fire_count: int) -> int | None:
    """How many more fires may run (0: it has ended); None: no limit."""
    return None if max_runs is None else max(max_runs - fire_count, 0)


class Lifecycle(models.Model):
    """The lifecycle fields of ``Schedule`` (``schedule_fields.LIFECYCLE_FIELDS``), and the
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
