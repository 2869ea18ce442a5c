"""Restoring a version: a schedule's versioned fields and calendars written back as a version
recorded, saved as a new version whose reason names the one restored (docs/versions.md).
A secret (``SECRET_FIELDS``: the ping URL) stays as it is now: a version holds only its
fingerprint."""

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import transaction

from django_periodic.models import versions as versioning
from django_periodic.models.schedule_fields import SECRET_FIELDS
from django_periodic.models.versions import ScheduleVersion

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule


def restore_version(version: ScheduleVersion, *, by: str | None = None) -> "Schedule":
    """Give its schedule the fields and calendars ``version`` recorded, through ``save()``
    (so the cursor moves as for an edit), as a new version by ``by`` (default: as
    ``changed_by()`` says). Raises ValidationError, saving nothing, when they are no longer
    valid: a job no longer registered, a name taken since, a calendar deleted. Its ping URL
    is kept as it is now (a version records only that it changed)."""
    using = version._state.db or "default"
    with transaction.atomic(using=using):
        schedules = type(version.schedule).objects.using(using).select_for_update()
        schedule = schedules.get(pk=version.schedule_id)
        fields = {field.attname: field for field in schedule._meta.concrete_fields}
        for name in versioning.COLUMNS:
            if name in version.fields and name not in SECRET_FIELDS:
                setattr(schedule, name, fields[name].to_python(version.fields[name]))
        calendar_model = schedule.calendars.model
        names = version.fields.get("calendars", [])
        calendars = list(calendar_model.objects.using(using).filter(name__in=names))
        schedule.full_clean()
        if missing := sorted(set(names) - {calendar.name for calendar in calendars}):
            raise ValidationError({"calendars": f"Deleted since: {', '.join(missing)}."})
        reason = (
            f"Restored revision {version.revision} (the version of "
            f"{version.created_at:%Y-%m-%d %H:%M:%S} UTC)."
        )
        old = versioning.calendar_names(schedule, using)
        with versioning.changed_by(by or versioning.author().by, reason):
            schedule.save(using=using)
            schedule.calendars.set(calendars)
            versioning.record_calendars(schedule, old, using)
        if sorted(old) != sorted(names):
            # Planned again from now under the calendars restored, as an edit of them is.
            schedules.filter(pk=schedule.pk).reschedule()
    return schedule
