"""A celery beat schedule written in code: ``CELERY_BEAT_SCHEDULE``, or a Celery app's
``beat_schedule``, mapped onto schedules as beat reads it.

Each entry is read strictly, as ``celery.beat.ScheduleEntry`` takes it: a key beat would
refuse, a value of the wrong type or out of range is ``Malformed`` and names the entry and
the key. A sound entry with no equivalent here (a solar or custom schedule class, a
``relative`` interval) is ``Unmappable``: reported, and the others are imported.

Crontabs run in celery's time zone, as ``Celery.timezone`` picks it: the ``timezone``
setting; else UTC with ``enable_utc`` (the default); else the process's local zone, which
Django sets to ``TIME_ZONE``.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.utils import timezone as django_timezone
from django.utils.module_loading import import_string

from django_periodic import registry
from django_periodic.operations.celerybeat.applying import (
    BEAT_ENTRY,
    TaskMapping,
    Unmappable,
    solar_reason,
)
from django_periodic.operations.celerybeat.crontabs import celery_cron_parts, cron_values
from django_periodic.operations.celerybeat.rows import Malformed, entry
from django_periodic.timing import triggers

# The keys of a beat entry (celery.beat.ScheduleEntry's arguments): those mapped, and those
# beat takes that no schedule holds (reported). Any other key is an error, as in beat.
MAPPED_KEYS = ("task", "schedule", "args", "kwargs", "options", "relative", "name")
NOTED_KEYS = ("last_run_at", "total_run_count", "app")
# Where each schedule field comes from, so that the schedule's own validation names it.
SOURCES = {"interval": "schedule", "cron": "schedule", "misfire_grace": "options.expires"}
SOURCES |= {"end_at": "options.expires", "tasks_backend": "options.queue"}
SETTING = "CELERY_BEAT_SCHEDULE"


@dataclass(frozen=True)
class BeatSchedule:
    """A beat schedule, where it was read (for messages), and celery's time zone for it."""

    entries: Any
    origin: str
    timezone: str


def from_settings() -> BeatSchedule:
    """``CELERY_BEAT_SCHEDULE``, in the zone of ``CELERY_TIMEZONE`` / ``CELERY_ENABLE_UTC``
    (the ``CELERY`` namespace of ``app.config_from_object("django.conf:settings", ...)``).

    Raises LookupError when the setting is missing."""
    if not hasattr(settings, SETTING):
        old = hasattr(settings, "CELERYBEAT_SCHEDULE")
        hint = " (CELERYBEAT_SCHEDULE is its old name: read it with --app)" if old else ""
        raise LookupError(f"The {SETTING} setting is missing{hint}.")
    zone = celery_timezone(
        getattr(settings, "CELERY_TIMEZONE", None),
        getattr(settings, "CELERY_ENABLE_UTC", True),
        ("CELERY_TIMEZONE", "CELERY_ENABLE_UTC"),
    )
    return BeatSchedule(getattr(settings, SETTING), SETTING, zone)


def from_app(path: str) -> BeatSchedule:
    """The ``beat_schedule`` of the Celery app at ``path`` ("module:attribute"), in its
    ``timezone`` / ``enable_utc``. Raises LookupError for a path that names no app."""
    module, colon, attribute = path.partition(":")
    if not (colon and module and attribute):
        raise LookupError(f"--app takes module:attribute (e.g. proj.celery:app), got {path!r}.")
    if module.startswith("."):  # relative to no package: import_module raises TypeError
        raise LookupError(f"--app takes the module's full dotted path (proj.celery), got {path!r}.")
    try:
        app = import_string(f"{module}.{attribute}")
    except ImportError as exc:
        raise LookupError(f"Cannot import the Celery app {path!r}: {exc}") from exc
    conf = getattr(app, "conf", None)
    if conf is None or not hasattr(conf, "beat_schedule"):
        raise LookupError(f"{path!r} is not a Celery app (it has no conf.beat_schedule).")
    zone = celery_timezone(conf.timezone, conf.enable_utc, ("timezone", "enable_utc"))
    return BeatSchedule(conf.beat_schedule, f"{path} beat_schedule", zone)


def celery_timezone(zone: Any, enable_utc: Any, keys: tuple[str, str]) -> str:
    """The zone celery runs crontabs in, as ``Celery.timezone`` picks it (``keys`` name the
    two settings in messages)."""
    if not isinstance(enable_utc, bool):
        raise Malformed(keys[1], f"expected True or False, found {enable_utc!r:.60}.")
    if zone in (None, ""):
        return "UTC" if enable_utc else str(settings.TIME_ZONE)
    if isinstance(zone, tzinfo):  # a ZoneInfo (its key), pytz's (its zone), or UTC
        zone = getattr(zone, "key", None) or getattr(zone, "zone", None) or zone.tzname(None)
    if not isinstance(zone, str):
        raise Malformed(keys[0], f"expected a time zone name, found {zone!r:.60}.")
    try:
        triggers.parse_timezone(zone)
    except triggers.InvalidTrigger as exc:
        raise Malformed(keys[0], str(exc)) from None
    return zone


def map_entries(
    beat: BeatSchedule, job_map: Mapping[str, str], queues: Mapping[str, str]
) -> list[TaskMapping]:
    """Every entry of ``beat``, in its order; ``job_map`` renames celery task names to job
    names, ``queues`` maps a celery queue to a tasks backend alias."""
    if not isinstance(beat.entries, dict):
        raise Malformed(
            None, f"{beat.origin} must be a dict of entries, not {_shown(beat.entries)}."
        )
    mappings = []
    for name, fields in beat.entries.items():
        if not isinstance(name, str):
            raise Malformed(None, f"{beat.origin}: an entry's name must be text, not {name!r:.60}.")
        with entry(f"{BEAT_ENTRY} {name!r}"):
            mappings.append(map_entry(name, fields, beat.timezone, job_map, queues))
    return mappings


def map_entry(
    name: str,
    fields: Any,
    zone: str,
    job_map: Mapping[str, str],
    queues: Mapping[str, str],
) -> TaskMapping:
    """One beat entry as schedule values, or the reason it cannot be mapped."""
    if not isinstance(fields, dict):
        raise Malformed(None, f"expected a dict (task, schedule, ...), found {_shown(fields)}.")
    unknown = [key for key in fields if key not in MAPPED_KEYS + NOTED_KEYS]
    if unknown:
        known = ", ".join(MAPPED_KEYS)
        raise Malformed(str(unknown[0]), f"not a key of a beat entry (it has {known}).")
    task = _required_text(fields, "task")
    if "schedule" not in fields:
        raise Malformed("schedule", "missing.")
    args, kwargs, options = _arguments(fields)
    relative = fields.get("relative", False)
    if not isinstance(relative, bool):
        raise Malformed("relative", f"expected True or False, found {_shown(relative)}.")
    notes = _noted_keys(name, fields)
    values: dict[str, Any] = {"job": job_map.get(task, task), "enabled": True}
    values |= _options(options, zone, queues, notes)
    try:
        values |= trigger(fields["schedule"], relative, zone, notes)
        values |= {"args": _stored("args", list(args)), "kwargs": _stored("kwargs", kwargs)}
    except Unmappable as exc:
        return TaskMapping(name, task, None, str(exc), tuple(notes), BEAT_ENTRY, SOURCES)
    return TaskMapping(name, task, values, notes=tuple(notes), kind=BEAT_ENTRY, sources=SOURCES)


def _required_text(fields: Mapping[str, Any], key: str) -> str:
    if key not in fields:
        raise Malformed(key, "missing.")
    value = fields[key]
    if not isinstance(value, str) or not value.strip():
        raise Malformed(key, f"expected a task name, found {_shown(value)}.")
    return value


def _arguments(fields: Mapping[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``args``, ``kwargs`` and ``options``, of the types beat applies them as."""
    args = fields.get("args") or ()
    if not isinstance(args, list | tuple):
        raise Malformed("args", f"expected a tuple or list, found {_shown(args)}.")
    kwargs, options = fields.get("kwargs") or {}, fields.get("options") or {}
    for key, value in (("kwargs", kwargs), ("options", options)):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise Malformed(key, f"expected a dict with text keys, found {_shown(value)}.")
    for key, value in (("args", args), ("kwargs", kwargs)):
        if problem := registry.argument_error(key, value):
            raise Malformed(key, problem)  # no schedule can hold it
    return args, kwargs, options


def _stored(key: str, value: Any) -> Any:
    """``value`` as a schedule stores it (JSON), or Unmappable saying why it cannot be."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise Unmappable(
            f"{key} cannot be stored as JSON ({exc}): pass plain values, and compute the "
            "others (a BeatLazyFunc, a date) in the job."
        ) from None
    return value


def _noted_keys(name: str, fields: Mapping[str, Any]) -> list[str]:
    """What beat itself ignores of an entry, and its history, which is not imported."""
    notes = []
    if "name" in fields and fields["name"] != name:
        notes.append(f"Its name key {fields['name']!r:.60} is ignored: beat names it by its key.")
    if "app" in fields:
        notes.append("Its app key is ignored: beat gives every entry its own app.")
    if fields.get("relative") and not isinstance(fields["schedule"], int | float | timedelta):
        notes.append("relative=True is ignored: beat applies it to seconds and timedeltas only.")
    history = [key for key in ("last_run_at", "total_run_count") if key in fields]
    if history:
        notes.append(f"History ({', '.join(history)}) is not imported: runs start afresh.")
    return notes


def trigger(schedule: Any, relative: bool, zone: str, notes: list[str]) -> dict[str, Any]:
    """The trigger fields of a beat entry's ``schedule``, as ``celery.schedules``'s
    ``maybe_schedule()`` reads it; ``relative`` applies to numbers and timedeltas."""
    if isinstance(schedule, bool) or not (
        isinstance(schedule, int | float | timedelta) or hasattr(schedule, "is_due")
    ):
        expected = "expected seconds, a timedelta or a schedule"
        raise Malformed("schedule", f"{expected}, found {_shown(schedule)}.")
    if isinstance(schedule, int | float | timedelta):
        return _interval(schedule, relative)
    kind, celery_schedules = type(schedule), _celery_schedules()
    if kind is getattr(celery_schedules, "schedule", None):
        _note_nowfun(schedule, zone, notes)
        return _interval(schedule.run_every, schedule.relative)
    if kind is getattr(celery_schedules, "crontab", None):
        _note_nowfun(schedule, zone, notes)
        return cron_values(celery_cron_parts(schedule), zone)
    if kind is getattr(celery_schedules, "solar", None):
        raise Unmappable(solar_reason(schedule.event, schedule.lat, schedule.lon))
    raise Unmappable(
        f"{kind.__module__}.{kind.__qualname__} is a schedule class of its own: its fire "
        "times are its code's. Write it as seconds, a timedelta, celery's schedule or a "
        "crontab, or create the schedule by hand (cron, interval or RRULE)."
    )


def _celery_schedules() -> Any:
    """``celery.schedules``, imported only for a schedule that may be one of its classes;
    None without celery (whose classes no schedule can then be)."""
    try:
        import celery.schedules
    except ImportError:
        return None
    return celery.schedules


def _interval(every: Any, relative: bool) -> dict[str, Any]:
    if isinstance(every, bool) or not isinstance(every, int | float | timedelta):
        raise Malformed("schedule", f"expected seconds or a timedelta, found {_shown(every)}.")
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if not math.isfinite(seconds) or seconds <= 0:
        raise Malformed("schedule", f"expected a positive duration, found {_shown(every)}.")
    try:
        interval = every if isinstance(every, timedelta) else timedelta(seconds=every)
    except OverflowError:
        raise Malformed("schedule", f"{every} seconds is out of range.") from None
    if relative:
        raise Unmappable(
            f"relative=True: beat rounds each fire of this {interval} interval down to its "
            "unit on the clock (the hour, the minute); write it as a cron (an hourly one: "
            "'0 * * * *')."
        )
    return {"interval": interval}


def _note_nowfun(schedule: Any, zone: str, notes: list[str]) -> None:
    if schedule.nowfun is not None:
        notes.append(
            f"nowfun {schedule.nowfun!r:.80} is not carried over: celery 5 matches a crontab "
            f"in the app's time zone ({zone}) whatever zone nowfun returns; schedules fire "
            "by the real clock."
        )


def _options(
    options: Mapping[str, Any], zone: str, queues: Mapping[str, str], notes: list[str]
) -> dict[str, Any]:
    """The schedule fields of an entry's ``options``; the rest noted as not carried over."""
    values: dict[str, Any] = {}
    if "expires" in options:
        values |= _expires(options["expires"], zone, notes)
    queue = options.get("queue")
    if queue is not None and not isinstance(queue, str):
        raise Malformed("options.queue", f"expected a queue name, found {_shown(queue)}.")
    mapped = {"expires"}
    if isinstance(queue, str) and queue in queues:
        values["tasks_backend"] = queues[queue]
        mapped.add("queue")
    others = {key: value for key, value in options.items() if key not in mapped}
    if others:
        shown = ", ".join(f"{key} {value!r:.60}" for key, value in others.items())
        hint = f" (--queue {queue}=<alias> runs it on a tasks backend)" if "queue" in others else ""
        notes.append(
            f"Message options ({shown}) are not carried over{hint}: runs execute on "
            "run_scheduler's workers, or on a tasks backend (Schedule.tasks_backend)."
        )
    return values


def _expires(expires: Any, zone: str, notes: list[str]) -> dict[str, Any]:
    """``expires`` in seconds: runs not started that long after their time are skipped
    (misfire_grace), as a worker discards the expired message; a datetime: the end."""
    if isinstance(expires, datetime):
        if django_timezone.is_naive(expires):
            expires = django_timezone.make_aware(expires, triggers.parse_timezone(zone))
        notes.append(f"expires {expires:%Y-%m-%d %H:%M:%S %Z} became end_at: it fires no more.")
        return {"end_at": expires}
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise Malformed(
            "options.expires", f"expected seconds or a datetime, found {_shown(expires)}."
        )
    if not math.isfinite(expires) or expires <= 0:
        raise Malformed(
            "options.expires", f"expected a positive number of seconds, found {expires}."
        )
    try:
        grace = timedelta(seconds=expires)
    except OverflowError:
        raise Malformed("options.expires", f"{expires} seconds is out of range.") from None
    notes.append(
        f"expires {expires} became misfire_grace: a run not started that long after its "
        "time is skipped."
    )
    return {"misfire_grace": grace}


def _shown(value: Any) -> str:
    """A value found in the schedule, for a message: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
