"""``import_celery_beat --emit-code``: a beat schedule, or django-celery-beat's periodic tasks,
as the Python module that defines the same schedules in code, with ``@job(...)``, instead of
rows.

A schedule defined in code is named after its job, and a beat entry after its key: so each
entry becomes a small job of the entry's name, with the entry's trigger and arguments, that
calls the job its task maps to (the same job, context and atomicity as an imported row's).
What cannot be emitted is said in comments, with the reason, each on one line (``escaped``):
the module stays valid Python whatever the names hold.
"""

import inspect
import keyword
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django_periodic import registry
from django_periodic.escaping import escaped
from django_periodic.operations.celerybeat.applying import TaskMapping, trigger_text

# The schedule values @job(...) takes, in the order they are written (the trigger first).
EMITTED_FIELDS: tuple[str, ...] = ("cron", "timezone", "interval", "run_at", "start_at")
EMITTED_FIELDS += ("args", "kwargs")
EMITTED_FIELDS += ("misfire_grace", "end_at", "tasks_backend")
LINE_LENGTH = 100
# Values a schedule has when @job(...) leaves them out.
OMITTED: dict[str, Any] = {"args": [], "kwargs": {}}


@dataclass(frozen=True)
class Emitted:
    """One mapping's code (a decorated function), or why it has none."""

    mapping: TaskMapping
    code: str = ""
    reason: str = ""


def emit(mapping: TaskMapping, problem: str, taken: set[str]) -> Emitted:
    """The job that defines ``mapping``'s schedule in code; ``problem`` is why its job or
    arguments do not validate, ``taken`` the function names used so far (updated)."""
    if mapping.values is None or problem:
        return Emitted(mapping, reason=mapping.reason or problem)
    if mapping.values.get("enabled") is False:
        # A schedule in code is created enabled: emitting it would start what beat had off.
        return Emitted(mapping, reason="it is disabled: define it in code when it is to run")
    target = registry.get_job(mapping.values["job"])
    options = [f"{key}={value}" for key, value in _options(mapping.values).items()]
    if target.name == mapping.name:
        return Emitted(
            mapping,
            reason="it has its job's name: give that job's @job(...) these options: "
            + ", ".join(options),
        )
    if mapping.name in registry.registered_jobs():
        return Emitted(mapping, reason="a job has its name already: rename the entry")
    func = target.func
    module, qualname = func.__module__, func.__qualname__
    if "<" in qualname or module == "__main__":
        return Emitted(mapping, reason=f"its job's function {module}.{qualname} has no import path")
    context = "context, " if target.takes_context else ""
    items = [f"name={_source(mapping.name)}"]
    items += ["takes_context=True"] if target.takes_context else []
    items += ["atomic=True"] if target.atomic else []
    items += options
    is_async = inspect.iscoroutinefunction(func)
    decorator = f"@job({', '.join(items)})"
    if len(decorator) > LINE_LENGTH:  # one option a line, as a formatter would write it
        decorator = "\n".join(["@job(", *(f"    {item}," for item in items), ")"])
    code = "\n".join(
        [
            escaped(f"# {mapping.label} ({mapping.celery_task}) -> {trigger_text(mapping.values)}"),
            decorator,
            f"{'async ' if is_async else ''}def {_function_name(mapping.name, taken)}"
            f"({context}*args, **kwargs):",
            f"    return {'await ' if is_async else ''}{module}.{qualname}"
            f"({context}*args, **kwargs)",
        ]
    )
    return Emitted(mapping, code=code)


def module_text(checked: Iterable[tuple[TaskMapping, str]], origin: str) -> str:
    """The module defining the schedules of ``checked`` mappings (each with the reason its
    job or arguments do not validate, or ""): imports, each entry's job, then what was not
    emitted and what is not carried over, as comments."""
    checked = list(checked)
    modules = sorted({_job_module(mapping) for mapping, problem in checked if not problem} - {""})
    # Function names must not hide what the module imports.
    taken = {"job", "datetime"} | {module.partition(".")[0] for module in modules}
    emitted = [emit(mapping, problem, taken) for mapping, problem in checked]
    done = [e for e in emitted if e.code]
    lines = [f'"""{origin}, as schedules defined in code (import_celery_beat --emit-code)."""']
    lines += ["", "import datetime"] if any("datetime." in e.code for e in done) else []
    lines += [""]
    lines += [
        f"import {module}" for module in modules if any(f" {module}." in e.code for e in done)
    ]
    lines += ["from django_periodic import job", ""]
    for item in done:
        lines += ["", item.code, ""]
    skipped = [e for e in emitted if not e.code]
    if skipped:
        lines += ["", "# Not emitted:"]
        for item in skipped:
            mapping = item.mapping
            lines.append(escaped(f"#   {mapping.label} ({mapping.celery_task}): {item.reason}"))
    notes = [(e.mapping.name, note) for e in emitted for note in e.mapping.notes]
    if notes:
        lines += ["", "# Not carried over:"]
        lines += [escaped(f"#   {name!r}: {note}") for name, note in notes]
    return "\n".join(lines).rstrip("\n") + "\n"


def _job_module(mapping: TaskMapping) -> str:
    """The module of the function of the job ``mapping`` runs ("" without one)."""
    if mapping.values is None:
        return ""
    try:
        return registry.get_job(mapping.values["job"]).func.__module__
    except registry.UnknownJob:
        return ""


def _options(values: Mapping[str, Any]) -> dict[str, str]:
    """The @job(...) options of these values, as Python source."""
    return {
        key: _source(values[key])
        for key in EMITTED_FIELDS
        if values.get(key) not in (None, "", OMITTED.get(key, ""))
    }


def _source(value: Any) -> str:
    """``value`` as Python source, as a formatter writes it (double quotes). A datetime (in
    UTC, whose repr needs no other module) or a timedelta names the ``datetime`` module,
    which the module imports."""
    if isinstance(value, str):
        text = repr(value)
        return f'"{text[1:-1]}"' if text.startswith("'") and '"' not in value else text
    if isinstance(value, list | tuple):
        return f"[{', '.join(map(_source, value))}]"
    if isinstance(value, dict):
        return f"{{{', '.join(f'{_source(k)}: {_source(v)}' for k, v in value.items())}}}"
    return repr(value.astimezone(UTC) if isinstance(value, datetime) else value)


def _function_name(name: str, taken: set[str]) -> str:
    """A function name for the entry ``name``: its words joined by underscores, unique."""
    base = re.sub(r"\W+", "_", name).strip("_").lower() or "entry"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = f"entry_{base}"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}_{number}", number + 1
    taken.add(candidate)
    return candidate
