"""Syncing the schedules defined in code (``@job(cron=...)``) into the database."""

import logging
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from django_periodic import registry
from django_periodic.choices import UNSET_TRIGGER
from django_periodic.error_texts import shown
from django_periodic.escaping import escaped
from django_periodic.models import Schedule, changed_by
from django_periodic.models.schedule_fields import SCHEDULE_OPTIONS

logger = logging.getLogger("django_periodic")
# Who made the versions of the schedules the code defines (docs/versions.md).
CODE = "code"


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def code_defined_values(job: registry.Job) -> dict[str, Any]:
    """The field values the code gives the schedule of ``job``.

    Options the code leaves out go back to their defaults, so deleting one in code counts.
    Raises TypeError for an option that is not a schedule field.
    """
    unknown = set(job.schedule) - SCHEDULE_OPTIONS - set(registry.TRIGGER_OPTIONS)
    if unknown:
        raise TypeError(f"@job got unknown options: {', '.join(sorted(unknown))}.")
    by_name = {f.name: f for f in Schedule._meta.concrete_fields}
    defaults = {name: by_name[name].get_default() for name in SCHEDULE_OPTIONS}
    values = {**defaults, **UNSET_TRIGGER, **job.schedule}
    return {**values, "job": job.name, "defined_in": job.defined_in}


def code_defined_jobs() -> dict[str, registry.Job]:
    return {name: job for name, job in registry.registered_jobs().items() if job.schedule}


def sync_code_schedules(using: str = "default") -> SyncReport:
    """Make the database match the schedules defined in code; history is never deleted.

    Created if missing, updated where the code changed, disabled when gone from code.
    A schedule paused in the admin stays paused.
    """
    report = SyncReport()
    wanted = code_defined_jobs()
    with transaction.atomic(using=using):
        existing = Schedule.objects.using(using).select_for_update()
        stored = {s.name: s for s in existing.filter(name__in=wanted)}
        for name, job in wanted.items():
            try:
                reason = f"Defined in code ({job.defined_in})."
                with transaction.atomic(using=using), changed_by(CODE, reason):
                    _sync_one(job, stored.get(name), report, using)
            except (ValidationError, TypeError) as exc:
                # One bad definition must not keep the scheduler from starting.
                logger.error("Code-defined schedule %r not synced: %s", name, shown(exc))
                report.invalid.append(name)
        gone = existing.exclude(defined_in="").exclude(name__in=wanted)
        for schedule in gone:
            schedule.last_error = f"No longer defined in code (was at {schedule.defined_in})."
            schedule.enabled, schedule.defined_in = False, ""
            with changed_by(CODE, schedule.last_error):
                schedule.save(using=using)
            report.disabled.append(schedule.name)
    for verb, names in vars(report).items():
        if names and verb != "invalid":
            logger.info("Code-defined schedules %s: %s", verb, escaped(", ".join(names)))
    return report


def _sync_one(job: registry.Job, schedule: Schedule | None, report: SyncReport, using: str) -> None:
    values = code_defined_values(job)
    if schedule is None:
        schedule = Schedule(name=job.name, **values)
        schedule.full_clean()
        schedule.save(using=using)
        report.created.append(schedule.name)
        return
    if not schedule.defined_in:
        values["enabled"] = True  # taking over a row that was removed from code earlier
        values["last_error"] = ""
    changed = {k: v for k, v in values.items() if getattr(schedule, k) != v}
    if changed:
        for key, value in changed.items():
            setattr(schedule, key, value)
        schedule.full_clean()
        schedule.save(using=using)
        report.updated.append(schedule.name)
