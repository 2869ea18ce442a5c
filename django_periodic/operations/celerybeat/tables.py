"""Migrating from django-celery-beat: its periodic tasks mapped onto schedules.

``rows`` reads django-celery-beat's rows, from a ``dumpdata`` file or its tables,
strictly; ``map_task()`` says what schedule a periodic task becomes, or why it cannot, and
what it loses on the way; ``applying.apply()`` validates and saves, all or nothing.

Data django-celery-beat could not have stored, or that no schedule can hold, is
``Malformed``: the import stops and saves nothing. A sound task with no equivalent here (a
solar schedule, a job not registered) is ``Unmappable``: it is reported, and the others are
imported.
"""

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django_periodic import registry
from django_periodic.operations.celerybeat.applying import (
    TaskMapping,
    Unmappable,
    solar_reason,
    utc_text,
)
from django_periodic.operations.celerybeat.crontabs import celery_text_part, cron_values
from django_periodic.operations.celerybeat.rows import (
    CRON_FIELDS,
    MODEL_LABELS,
    SCHEDULE_MODELS,
    Malformed,
    Rows,
    entry,
    task_entry,
)
from django_periodic.timing import triggers

# Routing options of a celery message; runs have no per-schedule broker route.
ROUTING_FIELDS = ("queue", "exchange", "routing_key", "priority")


def map_tasks(rows: Rows, job_map: Mapping[str, str], now: datetime) -> list[TaskMapping]:
    """Map every periodic task; ``job_map`` renames celery task names to job names."""
    return [map_task(task, rows, job_map, now) for task in rows.tasks]


def map_task(
    task: dict[str, Any], rows: Rows, job_map: Mapping[str, str], now: datetime
) -> TaskMapping:
    """One periodic task (as ``rows`` holds it) as schedule values (``now``: when a one-off
    task's next time is computed), or the reason it cannot be mapped; ``notes`` list what
    is not carried over. Raises Malformed for a duration out of range."""
    name, celery_task = task["name"], task["task"]
    notes: list[str] = []
    with entry(task_entry(name)):
        try:
            values = {
                "job": job_map.get(celery_task, celery_task),
                "args": _json_argument(task["args"], "args", list),
                "kwargs": _json_argument(task["kwargs"], "kwargs", dict),
                "enabled": task["enabled"],
                "start_at": task["start_time"],
                "end_at": task["expires"],
                **_trigger(task, rows, notes),
            }
            if task["one_off"] and "run_at" not in values:
                values = _one_off(values, task, now, notes)
        except Unmappable as exc:
            return TaskMapping(name, celery_task, None, str(exc), tuple(notes))
        if task["expire_seconds"]:
            seconds = task["expire_seconds"]
            values["misfire_grace"] = _duration("expire_seconds", seconds, "seconds")
            notes.append(
                f"expire_seconds {seconds} became misfire_grace: a run not "
                "started that long after its time is skipped."
            )
    notes += _not_carried_over(task)
    return TaskMapping(name, celery_task, values, notes=tuple(notes))


def _json_argument(text: str, key: str, kind: type) -> Any:
    if not text:
        return kind()  # blank=True in django-celery-beat: no arguments
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Unmappable(f"{key} is not valid JSON ({exc}): {text!r:.100}.") from None
    if not isinstance(value, kind):
        raise Unmappable(f"{key} must be a JSON {kind.__name__}, got {text!r:.100}.")
    if problem := registry.argument_error(key, value):
        raise Malformed(key, problem)  # no schedule can hold it
    return value


def _trigger(task: dict[str, Any], rows: Rows, notes: list[str]) -> dict[str, Any]:
    kinds = [key for key in SCHEDULE_MODELS if task[key] is not None]
    if len(kinds) != 1:
        raise Unmappable(f"It needs exactly one schedule, has {' and '.join(kinds) or 'none'}.")
    kind = kinds[0]
    row = rows.schedules[SCHEDULE_MODELS[kind]].get(task[kind])
    if row is None:
        raise Unmappable(f"Its {kind} schedule (pk {task[kind]!r}) is not among the rows read.")
    if kind == "crontab":
        return _cron(row)
    if kind == "interval":
        with entry(f"{MODEL_LABELS[SCHEDULE_MODELS[kind]]} pk {task[kind]!r}"):
            return _interval(row, task, notes)
    if kind == "clocked":
        if not task["one_off"]:
            notes.append("A clocked task without one_off became a one-shot all the same.")
        return {"run_at": row["clocked_time"]}
    raise Unmappable(solar_reason(row["event"], row["latitude"], row["longitude"]))


def _cron(row: dict[str, Any]) -> dict[str, Any]:
    # Celery's fields, in cron's order; it allows spaces inside a field ("1, 2").
    parts = [(row[key] or "*").replace(" ", "") for key in CRON_FIELDS]
    return cron_values([celery_text_part(p, i) for i, p in enumerate(parts)], row["timezone"])


def _interval(row: dict[str, Any], task: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    values = {"interval": _duration("every", row["every"], row["period"])}
    last_run = task["last_run_at"]
    if task["start_time"] is None and last_run is not None:
        # Celery's next fire is the last run + the interval: keep that phase.
        values["start_at"] = last_run
        notes.append(f"Fires at its last run ({last_run:%Y-%m-%d %H:%M:%S}) + k x interval.")
    return values


def _duration(field: str, amount: int, unit: str) -> timedelta:
    try:
        return timedelta(**{unit: amount})
    except OverflowError:
        raise Malformed(field, f"{amount} {unit} is out of range.") from None


def _one_off(
    values: dict[str, Any], task: dict[str, Any], now: datetime, notes: list[str]
) -> dict[str, Any]:
    """A one-off crontab or interval task: a one-shot at the trigger's next time."""
    recurring = {k: values.pop(k) for k in ("cron", "timezone", "interval") if k in values}
    start_at, end_at = values["start_at"], values["end_at"]
    inner: triggers.Trigger
    if "cron" in recurring:
        inner = triggers.cron(recurring["cron"], recurring["timezone"])
    else:
        inner = triggers.IntervalTrigger(recurring["interval"], start_at or now)
    run_at = triggers.BoundedTrigger(inner, start_at, end_at).next_after(now)
    if run_at is None:
        raise Unmappable("A one-off task whose schedule has no time left to fire.")
    notes.append(f"one_off: a one-shot at its schedule's next time, {run_at:%Y-%m-%d %H:%M}.")
    if task["total_run_count"]:
        values["enabled"] = False
        notes.append("one_off: it has run already, so it is imported disabled.")
    return {**values, "run_at": run_at, "start_at": None, "end_at": None}


def _not_carried_over(task: dict[str, Any]) -> list[str]:
    notes = []
    routing = {key: task[key] for key in ROUTING_FIELDS if task[key] not in (None, "")}
    if routing:
        shown = ", ".join(f"{key} {value!r}" for key, value in routing.items())
        notes.append(
            f"Message routing ({shown}) is not carried over: runs execute on run_scheduler's "
            "workers, or on a tasks backend (Schedule.tasks_backend, TASKS_QUEUE)."
        )
    if task["headers"] not in ("", "{}"):
        notes.append(f"Message headers {task['headers']!r:.100} are not carried over.")
    if task["total_run_count"] or task["last_run_at"]:
        last_run = utc_text(task["last_run_at"]) if task["last_run_at"] else "unknown"
        notes.append(
            f"History ({task['total_run_count']} runs, last at {last_run}) is not imported."
        )
    if task["description"]:
        notes.append("Its description is not carried over (schedules have none).")
    return notes
