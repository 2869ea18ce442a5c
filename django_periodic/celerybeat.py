"""Migrating from django-celery-beat: its periodic tasks mapped onto schedules.

Both sources, a ``dumpdata django_celery_beat`` JSON file and django-celery-beat's own
tables, are read as the same fixture records (plain dicts), so one pure mapping serves
both. ``map_task()`` says what schedule a periodic task becomes, or why it cannot, and
what it loses on the way; ``apply()`` validates and saves. django_celery_beat itself is
never imported: the app works, and reads dumps, without it.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import serializers
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import dateparse, timezone

from django_periodic import triggers
from django_periodic.models import Schedule

APP_LABEL = "django_celery_beat"
# The schedule models a periodic task may point to, by its foreign key's name.
SCHEDULE_MODELS = {
    "crontab": "crontabschedule",
    "interval": "intervalschedule",
    "clocked": "clockedschedule",
    "solar": "solarschedule",
}
TASK_MODEL = "periodictask"
INTERVAL_PERIODS = frozenset({"days", "hours", "minutes", "seconds", "microseconds"})
# Routing options of a celery message; runs have no per-schedule broker route.
ROUTING_FIELDS = ("queue", "exchange", "routing_key", "priority")


class Unmappable(Exception):
    """Why a periodic task cannot become a schedule."""


@dataclass(frozen=True)
class Rows:
    """django-celery-beat's rows as fixture records: periodic tasks, and the schedule rows
    of each model by primary key."""

    tasks: list[dict[str, Any]]
    schedules: dict[str, dict[Any, dict[str, Any]]]


@dataclass(frozen=True)
class TaskMapping:
    """What one periodic task becomes: schedule field values, or the reason it cannot."""

    name: str
    celery_task: str
    values: dict[str, Any] | None
    reason: str = ""
    notes: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What importing one mapping did (or, in a dry run, would do)."""

    mapping: TaskMapping
    action: str  # one of ACTIONS
    detail: str = ""


CREATE, UPDATE, EXISTS, NOT_IMPORTED = "create", "update", "exists", "not imported"
ACTIONS = (CREATE, UPDATE, EXISTS, NOT_IMPORTED)


def rows_from_fixture(records: Any) -> Rows:
    """Group the django_celery_beat records of a ``dumpdata`` fixture; others are ignored.

    Raises ValueError for data that is not a fixture.
    """
    if not isinstance(records, list):
        raise ValueError("A dumpdata fixture is a JSON list of records.")
    tasks: list[dict[str, Any]] = []
    schedules: dict[str, dict[Any, dict[str, Any]]] = {m: {} for m in SCHEDULE_MODELS.values()}
    for record in records:
        if not (isinstance(record, dict) and isinstance(record.get("fields"), dict)):
            raise ValueError(f"Not a fixture record (model, pk, fields): {record!r:.200}.")
        app, _, model = str(record.get("model", "")).partition(".")
        if app != APP_LABEL:
            continue
        if model == TASK_MODEL:
            tasks.append(record)
        elif model in schedules:
            schedules[model][record.get("pk")] = record["fields"]
    return Rows(sorted(tasks, key=lambda t: str(t["fields"].get("name", ""))), schedules)


def rows_from_database(using: str = "default") -> Rows:
    """django-celery-beat's rows in this database, read through its installed models."""
    from django.apps import apps

    if not apps.is_installed(APP_LABEL):
        raise LookupError(
            f"{APP_LABEL} is not in INSTALLED_APPS: read a dump of it instead (--from-json)."
        )
    records: list[Any] = []
    for model in (TASK_MODEL, *SCHEDULE_MODELS.values()):
        queryset = apps.get_model(APP_LABEL, model)._default_manager.using(using).order_by("pk")
        # The records dumpdata writes, so that a database and a dump map the same way; but
        # Python values, as JSON would cut datetimes to the millisecond.
        records += serializers.serialize("python", queryset)
    return rows_from_fixture(records)


def map_tasks(
    rows: Rows, job_map: Mapping[str, str], now: datetime, *, paused: bool = False
) -> list[TaskMapping]:
    """Map every periodic task; ``job_map`` renames celery task names to job names.

    ``paused`` maps every task disabled, to run beside beat until the cut-over."""
    mappings = [map_task(task["fields"], rows, job_map, now) for task in rows.tasks]
    if paused:
        for mapping in mappings:
            if mapping.values is not None:
                mapping.values["enabled"] = False
    return mappings


def map_task(
    task: dict[str, Any], rows: Rows, job_map: Mapping[str, str], now: datetime
) -> TaskMapping:
    """One periodic task's schedule values (``now``: when a one-off task's next time is
    computed), or the reason it cannot be mapped; ``notes`` list what is not carried over."""
    name, celery_task = str(task.get("name", "")), str(task.get("task", ""))
    notes: list[str] = []
    try:
        values = {
            "job": job_map.get(celery_task, celery_task),
            "args": _json_argument(task, "args", list, "[]"),
            "kwargs": _json_argument(task, "kwargs", dict, "{}"),
            "enabled": bool(task.get("enabled", True)),
            "start_at": _datetime(task.get("start_time")),
            "end_at": _datetime(task.get("expires")),
            **_trigger(task, rows, notes),
        }
        if task.get("one_off") and "run_at" not in values:
            values = _one_off(values, task, now, notes)
    except Unmappable as exc:
        return TaskMapping(name, celery_task, None, str(exc), tuple(notes))
    if task.get("expire_seconds"):
        values["misfire_grace"] = timedelta(seconds=int(task["expire_seconds"]))
        notes.append(
            f"expire_seconds {task['expire_seconds']} became misfire_grace: a run not "
            "started that long after its time is skipped."
        )
    notes += _not_carried_over(task)
    return TaskMapping(name, celery_task, values, notes=tuple(notes))


def _json_argument(task: dict[str, Any], key: str, kind: type, empty: str) -> Any:
    text = task.get(key) or empty
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        raise Unmappable(f"{key} is not valid JSON ({exc}): {text!r:.100}.") from None
    if not isinstance(value, kind):
        raise Unmappable(f"{key} must be a JSON {kind.__name__}, got {text!r:.100}.")
    return value


def _datetime(value: Any) -> datetime | None:
    """A fixture's datetime (ISO text, or a datetime); naive ones are in TIME_ZONE."""
    if value in (None, ""):
        return None
    parsed = value if isinstance(value, datetime) else dateparse.parse_datetime(str(value))
    if parsed is None:
        raise Unmappable(f"{value!r} is not a datetime.")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def _trigger(task: dict[str, Any], rows: Rows, notes: list[str]) -> dict[str, Any]:
    kinds = [key for key in SCHEDULE_MODELS if task.get(key) is not None]
    if len(kinds) != 1:
        raise Unmappable(f"It needs exactly one schedule, has {' and '.join(kinds) or 'none'}.")
    kind = kinds[0]
    row = rows.schedules[SCHEDULE_MODELS[kind]].get(task[kind])
    if row is None:
        raise Unmappable(f"Its {kind} schedule (pk {task[kind]}) is not among the rows read.")
    if kind == "crontab":
        return _cron(row)
    if kind == "interval":
        return _interval(row, task, notes)
    if kind == "clocked":
        if not task.get("one_off"):
            notes.append("A clocked task without one_off became a one-shot all the same.")
        return {"run_at": _datetime(row.get("clocked_time"))}
    raise Unmappable(
        f"Solar schedules ({row.get('event')} at {row.get('latitude')}, "
        f"{row.get('longitude')}) have no equivalent: use a cron at the event's usual "
        "time, or a job that sets its schedule's run_at to the next event."
    )


def _cron(row: dict[str, Any]) -> dict[str, Any]:
    # Celery's fields, in cron's order; it allows spaces inside a field ("1, 2").
    order = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    parts = [str(row.get(key) or "*").replace(" ", "") for key in order]
    expression = " ".join(parts)
    if not (parts[2].startswith("*") or parts[4].startswith("*")):
        raise Unmappable(
            f"crontab {expression!r}: celery fires on days matching both day_of_month and "
            "day_of_week, cron on days matching either; split it into two schedules, or "
            "check the day in the job."
        )
    tz = str(row.get("timezone") or "UTC")
    try:
        triggers.validate_cron(expression)
        triggers.parse_timezone(tz)
    except triggers.InvalidTrigger as exc:
        raise Unmappable(f"crontab {expression!r} ({tz}): {exc}") from None
    return {"cron": expression, "timezone": tz}


def _interval(row: dict[str, Any], task: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    every, period = row.get("every"), row.get("period")
    if period not in INTERVAL_PERIODS or not isinstance(every, int) or every < 1:
        raise Unmappable(f"Interval 'every {every} {period}' is not a positive interval.")
    values: dict[str, Any] = {"interval": timedelta(**{period: every})}
    last_run = _datetime(task.get("last_run_at"))
    if task.get("start_time") is None and last_run is not None:
        # Celery's next fire is the last run + the interval: keep that phase.
        values["start_at"] = last_run
        notes.append(f"Fires at its last run ({last_run:%Y-%m-%d %H:%M:%S}) + k x interval.")
    return values


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
    if task.get("total_run_count"):
        values["enabled"] = False
        notes.append("one_off: it has run already, so it is imported disabled.")
    return {**values, "run_at": run_at, "start_at": None, "end_at": None}


def _not_carried_over(task: dict[str, Any]) -> list[str]:
    notes = []
    routing = {key: task[key] for key in ROUTING_FIELDS if task.get(key) not in (None, "")}
    if routing:
        shown = ", ".join(f"{key} {value!r}" for key, value in routing.items())
        notes.append(
            f"Message routing ({shown}) is not carried over: runs execute on run_scheduler's "
            "workers, or on a tasks backend (Schedule.tasks_backend, TASKS_QUEUE)."
        )
    if task.get("headers") not in (None, "", "{}"):
        notes.append(f"Message headers {task['headers']!r:.100} are not carried over.")
    if task.get("total_run_count") or task.get("last_run_at"):
        notes.append(
            f"History ({task.get('total_run_count') or 0} runs, last at "
            f"{task.get('last_run_at') or 'unknown'}) is not imported."
        )
    if task.get("description"):
        notes.append("Its description is not carried over (schedules have none).")
    return notes


def apply(
    mappings: Iterable[TaskMapping], *, update: bool, dry_run: bool, using: str = "default"
) -> list[Outcome]:
    """Create (or with ``update``, overwrite) the schedules, in one transaction.

    A schedule that exists by name is left alone unless ``update``; one defined in code
    always is. Each schedule passes ``full_clean()`` or is reported, not saved. A dry run
    validates everything and saves nothing.
    """
    outcomes = []
    with transaction.atomic(using=using):
        for mapping in mappings:
            outcomes.append(_apply_one(mapping, update, dry_run, using))
    return outcomes


def _apply_one(mapping: TaskMapping, update: bool, dry_run: bool, using: str) -> Outcome:
    if mapping.values is None:
        return Outcome(mapping, NOT_IMPORTED, mapping.reason)
    schedule = Schedule.objects.using(using).filter(name=mapping.name).first()
    if schedule is not None and schedule.is_code_defined:
        return Outcome(mapping, EXISTS, f"defined in code ({schedule.defined_in})")
    if schedule is not None and not update:
        return Outcome(mapping, EXISTS, "a schedule has this name (--update overwrites it)")
    action = CREATE if schedule is None else UPDATE
    schedule = schedule or Schedule(name=mapping.name)
    # A schedule of another kind loses its old trigger.
    for key, value in {"cron": "", "interval": None, "run_at": None, **mapping.values}.items():
        setattr(schedule, key, value)
    try:
        schedule.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        return Outcome(mapping, NOT_IMPORTED, _validation_reason(exc, mapping))
    if not dry_run:
        schedule.save(using=using)
    return Outcome(mapping, action)


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
        text = f"once at {_utc(run_at)}" if run_at else "-"
    bounds = [f"from {_utc(values['start_at'])}"] if values.get("start_at") else []
    bounds += [f"until {_utc(values['end_at'])}"] if values.get("end_at") else []
    return " ".join([text, *bounds])


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
