"""The ``@job`` decorator and the registry of jobs.

Pure: no models are imported here (``engine/planning/code_schedules.py`` writes
code-defined schedules to the database), so ``from django_periodic import job`` works
before the apps are ready."""

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar, overload

from django_periodic.choices import KIND_FIELDS
from django_periodic.timing import recurrences, triggers

# The trigger options of @job(...), the fields of the trigger kinds: a code-defined
# schedule has exactly one.
TRIGGER_OPTIONS = tuple(KIND_FIELDS.values())

# How deep a job's arguments may nest lists and objects: far past any real argument, and far
# from the depth at which copying one (a version's snapshot) or encoding it exceeds Python's
# recursion limit.
MAX_ARGUMENT_DEPTH = 32

# A job function: @job returns it unchanged, so its own type.
_F = TypeVar("_F", bound=Callable[..., Any])


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
    #: Runs inside the transaction that records its outcome (docs/semantics.md, "Atomic jobs").
    atomic: bool = False

    @property
    def description(self) -> str:
        """The first line of the function's docstring."""
        return (inspect.getdoc(self.func) or "").partition("\n")[0]

    def check_arguments(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Raise TypeError if the job cannot be called with ``args`` and ``kwargs``."""
        context = [None] if self.takes_context else []
        inspect.signature(self.func).bind(*context, *args, **kwargs)


def argument_error(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be stored as a job's ``name`` (args or kwargs), or None if it can:
    a NaN or an infinity, which JSON has no numbers for (the databases refuse them), or lists
    and objects nested deeper than ``MAX_ARGUMENT_DEPTH``. Walked without recursion, so that
    any depth gets this answer."""
    waiting = [(value, 1)]
    while waiting:
        item, depth = waiting.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{name} cannot hold {json.dumps(item)}: JSON has no NaN or infinity."
        if isinstance(item, list | tuple | dict):
            if depth > MAX_ARGUMENT_DEPTH:
                return too_deep(name)
            inside = item.values() if isinstance(item, dict) else item
            waiting.extend((each, depth + 1) for each in inside)
    return None


def too_deep(name: str) -> str:
    """The error of arguments ``name`` nested deeper than ``MAX_ARGUMENT_DEPTH``."""
    return f"{name} cannot nest lists and objects more than {MAX_ARGUMENT_DEPTH} levels deep."


_registry: dict[str, Job] = {}


@overload
def job(func: _F, /) -> _F: ...
@overload
def job(
    *, name: str | None = None, takes_context: bool = False, atomic: bool = False, **options: Any
) -> Callable[[_F], _F]: ...
def job(
    func: _F | None = None,
    /,
    *,
    name: str | None = None,
    takes_context: bool = False,
    atomic: bool = False,
    **options: Any,
) -> _F | Callable[[_F], _F]:
    """Register a function as a job, by default as ``"<module>.<qualname>"``.

    Keyword options ``cron``, ``interval`` (a timedelta), ``run_at`` or ``rrule`` (with
    ``start_at``), with any of
    ``schedule_fields.SCHEDULE_OPTIONS``, also define a schedule of the same name in code; it is
    synced to the database when a scheduler starts. The function itself is returned
    unchanged. An ``async def`` function is awaited on an event loop when it runs.

    ``atomic=True`` runs the job inside the transaction that records its outcome, on the
    run's database: its writes commit with its success, or not at all (docs/semantics.md,
    "Atomic jobs"). An atomic job must be a plain function, not ``async def``.
    """

    def register(func: _F) -> _F:
        if atomic and inspect.iscoroutinefunction(func):
            raise TypeError(
                f"{func.__qualname__}: an atomic job must be a plain function: an async job's "
                "writes run on another thread and connection, outside the transaction that "
                "records its outcome."
            )
        registered = Job(
            name=name or f"{func.__module__}.{func.__qualname__}",
            func=func,
            takes_context=takes_context,
            schedule=_schedule_options(options),
            defined_in=code_location(func),
            atomic=atomic,
        )
        existing = _registry.get(registered.name)
        if existing and existing.defined_in != registered.defined_in:
            raise ValueError(
                f"Job name {registered.name!r} is already registered at {existing.defined_in}."
            )
        _registry[registered.name] = registered
        # Not `func.periodic_job = ...`: for mypy, a Callable has no such attribute.
        setattr(func, "periodic_job", registered)  # noqa: B010
        return func

    return register(func) if func is not None else register


def _schedule_options(options: dict[str, Any]) -> dict[str, Any]:
    """Check what can be checked without the models; the system check
    ``django_periodic.E004`` validates the whole schedule (unknown options too)."""
    given = set(TRIGGER_OPTIONS) & set(options)
    if options and len(given) != 1:
        kinds = ", ".join(TRIGGER_OPTIONS)
        raise TypeError(f"A code-defined schedule needs exactly one of {kinds}.")
    if "interval" in options and not isinstance(options["interval"], timedelta):
        raise TypeError("@job(interval=...) takes a datetime.timedelta.")
    if "run_at" in options and not isinstance(options["run_at"], datetime):
        raise TypeError("@job(run_at=...) takes an aware datetime.")
    # Fail at import, where the mistake is, rather than when a scheduler starts.
    if "cron" in options:
        triggers.validate_cron(options["cron"])
    if "rrule" in options:
        _check_rrule(options)
    if "timezone" in options:
        triggers.parse_timezone(options["timezone"])
    return dict(options)


def _check_rrule(options: dict[str, Any]) -> None:
    """An RRULE's text readable at import; its start_at is required (its DTSTART)."""
    if not isinstance(options["rrule"], str) or not isinstance(options.get("start_at"), datetime):
        raise TypeError("@job(rrule=...) takes RFC 5545 text, with start_at (an aware datetime).")
    recurrences.RRuleTrigger(options["rrule"], options["start_at"], options.get("timezone", "UTC"))


def code_location(func: Callable[..., Any]) -> str:
    """Where ``func`` is defined, "module:line" (the module alone for a callable without
    code of its own). The line comes from the code object, not the source file, which may
    be gone or not be Python (a job defined in a notebook or a doctest)."""
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return func.__module__
    return f"{func.__module__}:{code.co_firstlineno}"


def is_atomic(name: str) -> bool:
    """Whether the job of this name is atomic (one this process does not have is not)."""
    registered = _registry.get(name)
    return registered is not None and registered.atomic


def get_job(name: str) -> Job:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJob(f"No job named {name!r} is registered (with @job).") from None


def registered_jobs() -> dict[str, Job]:
    """All registered jobs by name (a copy)."""
    return dict(_registry)
