"""A schedule's lifecycle: when it ends (``max_runs``), whether it fires once on creation
(``fire_on_create``) and when it pauses itself (``pause_after_failures``); docs/policies.md,
"Lifecycle"."""

from django.db import models
from django.utils.translation import gettext_lazy as _


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
