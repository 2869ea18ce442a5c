"""Single-fire overrides: one fire of a schedule skipped, or moved to another time, this
once (``Schedule.skip_fire()``, ``Schedule.move_fire()``; docs/overrides.md). A moved fire
is keyed in the ledger by its original plan time, so it can never run twice."""

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic.choices import OverrideAction
from django_periodic.db import clock
from django_periodic.timing import bounds


class FireOverride(models.Model):
    """One fire of a schedule, at ``plan_time``, skipped or moved to ``move_to``."""

    Action = OverrideAction

    schedule = models.ForeignKey(
        "django_periodic.Schedule", on_delete=models.CASCADE, related_name="overrides"
    )
    plan_time = models.DateTimeField(help_text=_("The fire it overrides, as its trigger gives it."))
    action = models.CharField(max_length=8, choices=OverrideAction)
    move_to = models.DateTimeField(
        null=True, blank=True, help_text=_("A moved fire: when it runs instead.")
    )
    reason = models.CharField(max_length=500)
    by = models.CharField(max_length=150, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now())

    class Meta:
        ordering = ["schedule", "plan_time"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "plan_time"], name="periodic_override_one_per_fire"
            ),
            # A move names where to; a skip does not.
            models.CheckConstraint(
                condition=(Q(action=OverrideAction.MOVE) & Q(move_to__isnull=False))
                | (Q(action=OverrideAction.SKIP) & Q(move_to__isnull=True)),
                name="periodic_override_move_to",
            ),
            models.CheckConstraint(
                condition=Q(action__in=OverrideAction.values), name="periodic_override_action"
            ),
            models.CheckConstraint(
                condition=Q(plan_time__gte=bounds.EARLIEST, plan_time__lt=bounds.LATEST)
                & (
                    Q(move_to__isnull=True)
                    | Q(move_to__gte=bounds.EARLIEST, move_to__lt=bounds.LATEST)
                ),
                name="periodic_override_times_range",
            ),
        ]

    def __str__(self) -> str:
        if self.action == OverrideAction.MOVE:
            return f"{self.plan_time:%Y-%m-%d %H:%M} moved to {self.move_to:%Y-%m-%d %H:%M}"
        return f"{self.plan_time:%Y-%m-%d %H:%M} skipped"

    def clean(self) -> None:
        """Its times within the range every stored time keeps (``bounds.TIMES``), as its
        CHECK constraint has them: out of it, a time cannot even be converted to UTC."""
        errors = {
            name: message
            for name in ("plan_time", "move_to")
            if (message := bounds.TIMES.error(name, getattr(self, name)))
        }
        if errors:
            raise ValidationError(errors)

    @property
    def at(self) -> datetime:
        """Where its fire runs: its new time if moved, else its plan time."""
        return self.move_to or self.plan_time
