"""Restoring a version: a schedule's versioned fields and calendars, or a concurrency
limit's fields, written back as a version recorded, saved as a new version whose reason
names the one restored (docs/versions.md). A secret (``SECRET_FIELDS``: the ping URL) stays
as it is now: a version holds only its fingerprint."""

from typing import TYPE_CHECKING, overload

from django.core.exceptions import ValidationError
from django.db import models, transaction

from django_periodic.models import versions as versioning
from django_periodic.models.limits import VERSIONED_FIELDS as LIMIT_FIELDS
from django_periodic.models.limits import ConcurrencyLimit, LimitVersion
from django_periodic.models.schedule_fields import SECRET_FIELDS
from django_periodic.models.versions import ScheduleVersion

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule


@overload
def restore_version(version: ScheduleVersion, *, by: str | None = None) -> "Schedule": ...
@overload
def restore_version(version: LimitVersion, *, by: str | None = None) -> ConcurrencyLimit: ...
def restore_version(
    version: ScheduleVersion | LimitVersion, *, by: str | None = None
) -> "Schedule | ConcurrencyLimit":
    """Give its schedule the fields and calendars ``version`` recorded (or its concurrency
    limit the fields, for a ``LimitVersion``), through ``save()`` (so a schedule's cursor
    moves as for an edit), as a new version by ``by`` (default: as ``changed_by()`` says).
    Raises ValidationError, saving nothing, when they are no longer valid: a job no longer
    registered, a name taken since, a calendar deleted. A schedule's ping URL is kept as it
    is now (a version records only that it changed)."""
    if isinstance(version, LimitVersion):
        return _restore_limit(version, by)
    return _restore_schedule(version, by)


def _restore_schedule(version: ScheduleVersion, by: str | None) -> "Schedule":
    using = version._state.db or "default"
    with transaction.atomic(using=using):
        schedules = type(version.schedule).objects.using(using).select_for_update()
        schedule = schedules.get(pk=version.schedule_id)
        # A secret stays as it is now: its version holds only a fingerprint.
        columns = [name for name in versioning.COLUMNS if name not in SECRET_FIELDS]
        _set_recorded(schedule, version.fields, columns)
        calendar_model = schedule.calendars.model
        names = version.fields.get("calendars", [])
        calendars = list(calendar_model.objects.using(using).filter(name__in=names))
        schedule.full_clean()
        if missing := sorted(set(names) - {calendar.name for calendar in calendars}):
            raise ValidationError({"calendars": f"Deleted since: {', '.join(missing)}."})
        reason = f"Restored revision {version.revision} (the version of {_when(version)})."
        old = versioning.calendar_names(schedule, using)
        with versioning.changed_by(by or versioning.author().by, reason):
            schedule.save(using=using)
            schedule.calendars.set(calendars)
            versioning.record_calendars(schedule, old, using)
        if sorted(old) != sorted(names):
            # Planned again from now under the calendars restored, as an edit of them is.
            schedules.filter(pk=schedule.pk).reschedule()
    return schedule


def _restore_limit(version: LimitVersion, by: str | None) -> ConcurrencyLimit:
    using = version._state.db or "default"
    with transaction.atomic(using=using):
        limits = ConcurrencyLimit.objects.using(using).select_for_update()
        limit = limits.get(pk=version.limit_id)
        _set_recorded(limit, version.fields, LIMIT_FIELDS)
        limit.full_clean()
        reason = f"Restored the version of {_when(version)}."
        with versioning.changed_by(by or versioning.author().by, reason):
            limit.save(using=using)
    return limit


def _set_recorded(
    instance: models.Model, recorded: dict[str, object], names: list[str] | tuple[str, ...]
) -> None:
    """Set the fields ``names`` of ``instance`` to the values a version recorded (JSON, back
    to Python); a field it did not record keeps its value."""
    fields = {field.attname: field for field in instance._meta.concrete_fields}
    for name in names:
        if name in recorded:
            setattr(instance, name, fields[name].to_python(recorded[name]))


def _when(version: ScheduleVersion | LimitVersion) -> str:
    """When a version was recorded, as the reason of its restore names it."""
    return f"{version.created_at:%Y-%m-%d %H:%M:%S} UTC"
