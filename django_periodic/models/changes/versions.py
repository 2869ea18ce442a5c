"""Versions: one row for every change of a schedule made through the app's surface (the
admin, ``save()``, code-defined schedules synced at start, pause and resume, the importer),
with who made it, why, and the changes field by field. ``QuerySet.update()`` bypasses
``save()`` and so makes none (docs/versions.md)."""

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic.db import clock


class ScheduleVersion(models.Model):
    """A schedule as one change left it: its revision, when, who, why, and what changed."""

    schedule = models.ForeignKey(
        "django_periodic.Schedule", on_delete=models.CASCADE, related_name="versions"
    )
    revision = models.PositiveIntegerField(
        help_text=_("The schedule's revision after this change; its runs record theirs.")
    )
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now())
    by = models.CharField(
        max_length=150,
        blank=True,
        default="",
        db_default="",
        help_text=_('Who made it: a user, or "code", "import", a process.'),
    )
    reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    # {field: [old, new]}, as JSON values (times and durations as ISO 8601 text).
    changes = models.JSONField(default=dict, db_default={}, blank=True)
    # The versioned fields as this change left them: what "restore this version" writes.
    fields = models.JSONField(default=dict, db_default={}, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["schedule", "-created_at"], name="periodic_version_schedule"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.created_at:%Y-%m-%d %H:%M:%S}"
