"""The ``@job`` decorator, the registry of jobs, and syncing code-defined schedules."""

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from django_periodic import triggers

logger = logging.getLogger("django_periodic")

# Schedule fields by role; the admin's form and fieldsets are laid out from these too.
JOB_FIELDS = ("args", "kwargs")
TRIGGER_FIELDS = ("cron", "timezone", "interval", "run_at", "start_at", "end_at")
POLICY_FIELDS = (
    "overlap",
    "max_queued",
    "max_concurrent",
    "misfire",
    "misfire_grace",
    "max_attempts",
    "retry_backoff",
    "timeout",
    "lease_timeout",
    "allow_stale_reentry",
)
TRIGGER_OPTIONS = frozenset({"cron", "interval", "run_at"})
# What @job(...) accepts besides the trigger: every field the code may define.
SCHEDULE_OPTIONS = frozenset(JOB_FIELDS + TRIGGER_FIELDS + POLICY_FIELDS) - TRIGGER_OPTIONS


class UnknownJob(LookupError):
    pass


@dataclass(frozen=True)
class Job:
    """A registered job: a function and, optionally, the schedule its code defines."""

    name: str
    func: Callable[..., Any]
    takes_context: bool = False
    schedule: dict[str, Any] = field(default_factory=dict)
    defined_in: str = ""

    @property
    def description(self) -> str:
        """The first line of the function's docstring."""
        return (inspect.getdoc(self.func) or "").partition("\n")[0]

    def check_arguments(self, args: list, kwargs: dict) -> None:
        """Raise TypeError if the job cannot be called with ``args`` and ``kwargs``."""
        context = [None] if self.takes_context else []
        inspect.signature(self.func).bind(*context, *args, **kwargs)


_registry: dict[str, Job] = {}


@overload
def job(func: Callable, /) -> Callable: ...
@overload
def job(*, name: str | None = None, takes_context: bool = False, **options: Any) -> Callable: ...
def job(func=None, /, *, name=None, takes_context=False, **options):
    """Register a function as a job, by default as ``"<module>.<qualname>"``.

    Keyword options ``cron``, ``interval`` (a timedelta) or ``run_at``, with any of
    ``SCHEDULE_OPTIONS``, also define a schedule of the same name in code; it is synced
    to the database when a scheduler starts. The function itself is returned unchanged.
    """

    def register(func: Callable) -> Callable:
        registered = Job(
            name=name or f"{func.__module__}.{func.__qualname__}",
            func=func,
            takes_context=takes_context,
            schedule=_schedule_options(options),
            defined_in=_location(func),
        )
        existing = _registry.get(registered.name)
        if existing and existing.defined_in != registered.defined_in:
            raise ValueError(
                f"Job name {registered.name!r} is already registered at {existing.defined_in}."
            )
        _registry[registered.name] = registered
        func.periodic_job = registered
        return func

    return register(func) if func is not None else register


def _schedule_options(options: dict[str, Any]) -> dict[str, Any]:
    unknown = set(options) - TRIGGER_OPTIONS - SCHEDULE_OPTIONS
    if unknown:
        raise TypeError(f"@job got unknown options: {', '.join(sorted(unknown))}.")
    given = TRIGGER_OPTIONS & set(options)
    if options and len(given) != 1:
        raise TypeError("A code-defined schedule needs exactly one of cron, interval or run_at.")
    if "interval" in options and not isinstance(options["interval"], timedelta):
        raise TypeError("@job(interval=...) takes a datetime.timedelta.")
    if "run_at" in options and not isinstance(options["run_at"], datetime):
        raise TypeError("@job(run_at=...) takes an aware datetime.")
    # Fail at import, where the mistake is, rather than when a scheduler starts.
    if "cron" in options:
        triggers.validate_cron(options["cron"])
    if "timezone" in options:
        triggers.parse_timezone(options["timezone"])
    return dict(options)


def _location(func: Callable) -> str:
    try:
        line = inspect.getsourcelines(func)[1]
    except (OSError, TypeError):
        return func.__module__
    return f"{func.__module__}:{line}"


def get_job(name: str) -> Job:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJob(f"No job named {name!r} is registered (with @job).") from None


def registered_jobs() -> dict[str, Job]:
    """All registered jobs by name (a copy)."""
    return dict(_registry)


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def sync_code_schedules(using: str = "default") -> SyncReport:
    """Make the database match the schedules defined in code; history is never deleted.

    Created if missing, updated where the code changed, disabled when gone from code.
    A schedule paused in the admin stays paused.
    """
    from django.core.exceptions import ValidationError
    from django.db import transaction

    from django_periodic.models import Schedule

    report = SyncReport()
    wanted = {name: j for name, j in _registry.items() if j.schedule}
    with transaction.atomic(using=using):
        existing = Schedule.objects.using(using).select_for_update()
        stored = {s.name: s for s in existing.filter(name__in=wanted)}
        for name, registered in wanted.items():
            try:
                with transaction.atomic(using=using):
                    _sync_one(registered, stored.get(name), report, using)
            except ValidationError as exc:
                # One bad definition must not keep the scheduler from starting.
                logger.error("Code-defined schedule %r not synced: %s", name, exc)
                report.invalid.append(name)
        gone = existing.exclude(defined_in="").exclude(name__in=wanted)
        for schedule in gone:
            schedule.last_error = f"No longer defined in code (was at {schedule.defined_in})."
            schedule.enabled, schedule.defined_in = False, ""
            schedule.save(using=using)
            report.disabled.append(schedule.name)
    for verb, names in vars(report).items():
        if names and verb != "invalid":
            logger.info("Code-defined schedules %s: %s", verb, ", ".join(names))
    return report


def _sync_one(registered: Job, schedule, report: SyncReport, using: str) -> None:
    from django_periodic.models import Schedule

    # Options the code leaves out go back to their defaults, so deleting one in code counts.
    defaults = {name: Schedule._meta.get_field(name).get_default() for name in SCHEDULE_OPTIONS}
    values = {**defaults, "cron": "", "interval": None, "run_at": None, **registered.schedule}
    values.update(job=registered.name, defined_in=registered.defined_in)
    if schedule is None:
        schedule = Schedule(name=registered.name, **values)
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
