"""What a celery beat task or entry becomes, and saving it: shared by every source.

A source (django-celery-beat's rows in ``tables``, a ``beat_schedule`` in ``code``) maps
each task onto schedule field values, a ``TaskMapping``; ``apply()`` validates them with the
schedule's own ``full_clean()`` and saves them, all or nothing.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from django_periodic.choices import UNSET_TRIGGER
from django_periodic.models import Schedule, changed_by
from django_periodic.operations.celerybeat.rows import Malformed, entry

# Schedule fields whose errors are the project's code to fix (a job to register, or one
# that takes these arguments), not the data's: such a task is reported, not malformed.
CODE_FIELDS = frozenset({"job", "args", "kwargs"})
# Who made the versions of the schedules it imports (docs/versions.md).
IMPORT = "import"
# What each source calls what it maps (django-celery-beat's rows; a beat_schedule's keys).
PERIODIC_TASK, BEAT_ENTRY = "periodic task", "beat entry"


class Unmappable(Exception):
    """Why a periodic task cannot become a schedule."""


@dataclass(frozen=True)
class TaskMapping:
    """What one periodic task becomes: schedule field values, or the reason it cannot.

    ``sources`` names, for a schedule field, the source's field its value came from, so an
    error of the schedule's ``full_clean()`` names what the user wrote."""

    name: str
    celery_task: str
    values: dict[str, Any] | None
    reason: str = ""
    notes: tuple[str, ...] = ()
    kind: str = PERIODIC_TASK
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How messages name it: "periodic task 'nightly'", "beat entry 'nightly'"."""
        return f"{self.kind} {self.name!r}"


@dataclass
class ImportedTask:
    """What importing one mapping did (or, in a dry run, would do)."""

    mapping: TaskMapping
    action: str  # one of ACTIONS
    detail: str = ""


CREATE, UPDATE, EXISTS, NOT_IMPORTED = "create", "update", "exists", "not imported"
ACTIONS = (CREATE, UPDATE, EXISTS, NOT_IMPORTED)


def solar_reason(event: object, latitude: object, longitude: object) -> str:
    """Why a solar schedule is not imported, and what to do instead."""
    return (
        f"Solar schedules ({event} at {latitude}, {longitude}) have no equivalent: use a cron "
        "at the event's usual time, or a job that sets its schedule's run_at to the next event."
    )


def pause(mappings: Iterable[TaskMapping]) -> None:
    """Map every task disabled, to run beside beat until the cut-over (``--paused``)."""
    for mapping in mappings:
        if mapping.values is not None:
            mapping.values["enabled"] = False


def apply(
    mappings: Iterable[TaskMapping], *, update: bool, dry_run: bool, using: str = "default"
) -> list[ImportedTask]:
    """Create (or with ``update``, overwrite) the schedules, in one transaction.

    A schedule that exists by name is left alone unless ``update``; one defined in code
    always is. Each schedule passes ``full_clean()``: one that fails on its job or its
    arguments is reported, not saved; on any other field, the data is malformed, and
    Malformed rolls back the whole import. A dry run validates everything and saves nothing.
    """
    outcomes = []
    with transaction.atomic(using=using):
        for mapping in mappings:
            with entry(mapping.label):
                outcomes.append(_apply_one(mapping, update, dry_run, using))
    return outcomes


def _apply_one(mapping: TaskMapping, update: bool, dry_run: bool, using: str) -> ImportedTask:
    if mapping.values is None:
        return ImportedTask(mapping, NOT_IMPORTED, mapping.reason)
    schedule = Schedule.objects.using(using).filter(name=mapping.name).first()
    if schedule is not None and schedule.is_code_defined:
        return ImportedTask(mapping, EXISTS, f"defined in code ({schedule.defined_in})")
    if schedule is not None and not update:
        return ImportedTask(mapping, EXISTS, "a schedule has this name (--update overwrites it)")
    action = CREATE if schedule is None else UPDATE
    schedule = schedule or Schedule(name=mapping.name)
    problem = validate(mapping, schedule)
    if problem:
        return ImportedTask(mapping, NOT_IMPORTED, problem)
    if not dry_run:
        reason = f"Imported from celery beat: {mapping.label} ({mapping.celery_task})."
        with changed_by(IMPORT, reason):
            schedule.save(using=using)
    return ImportedTask(mapping, action)


def validate(mapping: TaskMapping, schedule: Schedule | None = None) -> str:
    """Set the mapped values on ``schedule`` (a new one by default) and ``full_clean()`` it.

    Returns why it cannot be imported when it has no values or its job or arguments fail
    (the project's code to fix), "" when it is valid. Raises Malformed, naming the source's
    field, for another."""
    if mapping.values is None:
        return mapping.reason
    schedule = schedule or Schedule(name=mapping.name)
    # A schedule of another kind loses its old trigger.
    for key, value in {**UNSET_TRIGGER, **mapping.values}.items():
        setattr(schedule, key, value)
    try:
        schedule.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            if name not in CODE_FIELDS:
                raise Malformed(mapping.sources.get(name, name), " ".join(messages)) from None
        return _validation_reason(exc, mapping)
    return ""


def _validation_reason(exc: ValidationError, mapping: TaskMapping) -> str:
    messages = [f"{key}: {' '.join(errors)}" for key, errors in exc.message_dict.items()]
    if "job" in exc.message_dict:
        messages.append(f"(register it with @job, or --job-map {mapping.celery_task}=<job>)")
    return " ".join(messages)


def trigger_text(values: Mapping[str, Any]) -> str:
    """The trigger of mapped schedule values, for a person to read."""
    if values.get("cron"):
        text = f"cron {values['cron']} ({values['timezone']})"
    elif values.get("interval") is not None:
        text = f"every {values['interval']}"
    else:
        run_at = values.get("run_at")
        text = f"once at {utc_text(run_at)}" if run_at else "-"
    bounds = [f"from {utc_text(values['start_at'])}"] if values.get("start_at") else []
    bounds += [f"until {utc_text(values['end_at'])}"] if values.get("end_at") else []
    return " ".join([text, *bounds])


def utc_text(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
