"""django-celery-beat's rows, read strictly: from a ``dumpdata`` fixture, or its own tables.

Both sources become the same checked records (plain dicts of Python values), which
``tables`` maps onto schedules. A value django-celery-beat could not have stored (a
wrong type, a date that does not exist, a number out of its field's range) is
``Malformed``, and names the record and field that hold it: nothing is guessed, as
``bool("false")`` would. django_celery_beat itself is never imported.
"""

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core import serializers
from django.core.exceptions import ValidationError
from django.db import DataError, transaction
from django.db.models import QuerySet
from django.utils import dateparse, timezone

from django_periodic.timing import bounds, triggers

APP_LABEL = "django_celery_beat"
# The schedule models a periodic task may point to, by its foreign key's name.
SCHEDULE_MODELS = {
    "crontab": "crontabschedule",
    "interval": "intervalschedule",
    "clocked": "clockedschedule",
    "solar": "solarschedule",
}
TASK_MODEL = "periodictask"
# How messages name a record of each model ("crontab schedule pk 3").
MODEL_LABELS = {TASK_MODEL: "periodic task"} | {
    model: f"{kind} schedule" for kind, model in SCHEDULE_MODELS.items()
}
INTERVAL_PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")
CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
# How long each may be (its max_length in django-celery-beat): longer, it could not store it.
CRON_FIELD_LENGTHS = dict(zip(CRON_FIELDS, (60 * 4, 24 * 4, 31 * 4, 64, 64), strict=True))


class Malformed(ValueError):
    """A value django-celery-beat could not have stored, or that no schedule can hold.

    ``entries`` name where it is, innermost first ("interval schedule pk 2", then the
    periodic task that uses it); ``field`` is the field that holds it.
    """

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem
        self.entries: list[str] = []

    def __str__(self) -> str:
        where = " of ".join(self.entries)
        if self.field:
            where += f", field {self.field!r}" if where else f"field {self.field!r}"
        return f"{where[:1].upper()}{where[1:]}: {self.problem}" if where else self.problem


@contextmanager
def entry(name: str) -> Iterator[None]:
    """Name the entry being read in a Malformed raised while reading it."""
    try:
        yield
    except Malformed as exc:
        exc.entries.append(name)
        raise


def task_entry(name: str) -> str:
    """How messages name a periodic task: by its name, unique in django-celery-beat."""
    return f"{MODEL_LABELS[TASK_MODEL]} {name!r}"


# -- readers: a field's value checked (and converted), or ValueError saying what it is not


def _shown(value: Any) -> str:
    """A value found in the data, for a message: short, whatever it is."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false: as the file says
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, found {_shown(value)}.")
    return value


def _text_of_at_most(length: int) -> Callable[[Any], str]:
    def read(value: Any) -> str:
        text = _text(value)
        if len(text) > length:
            raise ValueError(f"expected at most {length} characters, found {len(text)}.")
        return text

    return read


def _boolean(value: Any) -> bool:
    # Only true and false: "false" would be true to bool(), and "0" or 0 a guess either way.
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, found {_shown(value)}.")
    return value


def _count(value: Any, least: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected a whole number, found {_shown(value)}.")
    if value < least:
        raise ValueError(f"expected a number of at least {least}, found {value}.")
    return value


def _positive(value: Any) -> int:
    return _count(value, least=1)


def _key(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a primary key, found {_shown(value)}.")
    return value


def _decimal(value: Any) -> str:
    """A decimal, as text (a dump holds one as text, the database as a Decimal)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise ValueError(f"expected a number, found {_shown(value)}.")
    return str(value)


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, found {_shown(value)}.")
    return value


def _period(value: Any) -> str:
    if _text(value) not in INTERVAL_PERIODS:
        raise ValueError(f"expected one of {', '.join(INTERVAL_PERIODS)}, found {_shown(value)}.")
    return str(value)


def _timezone(value: Any) -> str:
    # django-celery-beat's TimeZoneField cannot read an unknown one either.
    try:
        triggers.parse_timezone(_text(value))
    except triggers.InvalidTrigger as exc:
        raise ValueError(str(exc)) from None
    return str(value)


def _datetime(value: Any) -> datetime:
    """A datetime, or its ISO text; a naive one is in TIME_ZONE."""
    parsed = value if isinstance(value, datetime) else None
    if isinstance(value, str):
        try:
            parsed = dateparse.parse_datetime(value)
        except ValueError as exc:  # shaped like one, but it does not exist
            raise ValueError(f"{_shown(value)} is not a date and time ({exc}).") from None
    if parsed is None:
        raise ValueError(f"expected a date and time, found {_shown(value)}.")
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    if not bounds.EARLIEST <= parsed < bounds.LATEST:
        raise ValueError(
            f"{_shown(value)} is out of range: from {bounds.EARLIEST:%Y-%m-%d} to before "
            f"{bounds.LATEST:%Y-%m-%d}."
        )
    return parsed


Reader = Callable[[Any], Any]
# The default of a field with none. A default of None marks a nullable field (as in
# django-celery-beat's models): null is read as None, never handed to the reader.
_REQUIRED: Any = object()

# Every field read of each model: its reader, and its value when a record lacks it (a dump
# written by hand, or by an older django-celery-beat).
TASK_FIELDS: dict[str, tuple[Reader, Any]] = {
    "name": (_text, _REQUIRED),
    "task": (_text, ""),
    **{kind: (_key, None) for kind in SCHEDULE_MODELS},
    "args": (_text, "[]"),
    "kwargs": (_text, "{}"),
    "enabled": (_boolean, True),
    "one_off": (_boolean, False),
    "start_time": (_datetime, None),
    "expires": (_datetime, None),
    "expire_seconds": (_count, None),
    "last_run_at": (_datetime, None),
    "total_run_count": (_count, 0),
    "queue": (_text, None),
    "exchange": (_text, None),
    "routing_key": (_text, None),
    "priority": (_count, None),
    "headers": (_text, "{}"),
    "description": (_text, ""),
}
SCHEDULE_FIELDS: dict[str, dict[str, tuple[Reader, Any]]] = {
    "crontabschedule": {
        **{key: (_text_of_at_most(CRON_FIELD_LENGTHS[key]), "*") for key in CRON_FIELDS},
        "timezone": (_timezone, "UTC"),
    },
    "intervalschedule": {"every": (_positive, _REQUIRED), "period": (_period, _REQUIRED)},
    "clockedschedule": {"clocked_time": (_datetime, _REQUIRED)},
    "solarschedule": {
        "event": (_text, _REQUIRED),
        "latitude": (_decimal, _REQUIRED),
        "longitude": (_decimal, _REQUIRED),
    },
}


def _field(fields: Mapping[str, Any], key: str, reader: Reader, default: Any) -> Any:
    value = fields.get(key, default)
    if value is _REQUIRED:
        raise Malformed(key, "missing.")
    if value is None and default is None:
        return None
    try:
        return reader(value)
    except ValueError as exc:
        raise Malformed(key, str(exc)) from None


def _read(fields: Mapping[str, Any], readers: Mapping[str, tuple[Reader, Any]]) -> dict[str, Any]:
    """The fields ``readers`` lists, each read strictly; others are ignored."""
    return {key: _field(fields, key, *reader) for key, reader in readers.items()}


# -- the two sources


@dataclass(frozen=True)
class Rows:
    """django-celery-beat's rows, each read strictly (``TASK_FIELDS``, ``SCHEDULE_FIELDS``):
    the periodic tasks in the order of their names, and the schedule rows of each model by
    primary key."""

    tasks: list[dict[str, Any]]
    schedules: dict[str, dict[Any, dict[str, Any]]]


def rows_from_fixture(records: Any) -> Rows:
    """Read the django_celery_beat records of a ``dumpdata`` fixture; others are ignored.

    Raises Malformed for data that is not a fixture, and for a record of django_celery_beat
    that it could not have stored: a record is named by its place in the list, from 1.
    """
    if not isinstance(records, list):
        raise Malformed(
            None, f"A dumpdata fixture is a JSON list of records, not {_shown(records)}."
        )
    tasks: dict[str, dict[str, Any]] = {}
    schedules: dict[str, dict[Any, dict[str, Any]]] = {m: {} for m in SCHEDULE_MODELS.values()}
    for index, record in enumerate(records, start=1):
        with entry(f"record {index}"):
            model, pk, fields = _record(record)
        if model == TASK_MODEL:
            with entry(f"record {index}"):
                name = _field(fields, "name", _text, _REQUIRED)
            with entry(task_entry(name)):
                if name in tasks:
                    raise Malformed("name", "two periodic tasks have this name.")
                tasks[name] = _read(fields, TASK_FIELDS)
        elif model in schedules:
            with entry(f"{MODEL_LABELS[model]} pk {pk!r}"):
                if pk in schedules[model]:
                    raise Malformed("pk", f"two {MODEL_LABELS[model]}s have this pk.")
                schedules[model][pk] = _read(fields, SCHEDULE_FIELDS[model])
    return Rows([tasks[name] for name in sorted(tasks)], schedules)


def _record(record: Any) -> tuple[str, Any, dict[str, Any]]:
    """A fixture record's model (its name in django_celery_beat, "" for another app's),
    primary key and fields."""
    if not isinstance(record, dict):
        raise Malformed(None, f"expected a record (model, pk, fields), found {_shown(record)}.")
    app, _, model = _field(record, "model", _text, _REQUIRED).partition(".")
    pk = _field(record, "pk", _key, None)
    fields = _field(record, "fields", _object, _REQUIRED)
    return model if app == APP_LABEL else "", pk, fields


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
        records += _records(queryset)
    return rows_from_fixture(records)


# What a model field's conversion raises for a value stored around the model (raw SQL): a
# time zone that does not exist, text in SQLite that is no date, a date past Python's.
_UNREADABLE = (ValidationError, ValueError, TypeError, AttributeError, OverflowError, DataError)


def _records(queryset: QuerySet[Any]) -> list[Any]:
    """The records dumpdata writes of these rows, so that a database and a dump map the
    same way; but Python values, as JSON would cut datetimes to the millisecond.

    Raises Malformed, naming the row and the field, for a value the model cannot read.
    """
    try:
        # A savepoint: on PostgreSQL a failed read ends the transaction it is in.
        with transaction.atomic(using=queryset.db):
            records: list[Any] = serializers.serialize("python", queryset)
    except _UNREADABLE:
        raise _unreadable_value(queryset) from None
    return records


def _unreadable_value(queryset: QuerySet[Any]) -> Malformed:
    """The value of these rows their model cannot read: the column, then the row."""
    model = queryset.model
    label = MODEL_LABELS[model._meta.model_name or ""]
    for field in model._meta.concrete_fields:
        column = queryset.values_list(field.attname)
        if _read_error(column) is None:
            continue
        for pk in queryset.values_list("pk", flat=True):
            error = _read_error(column.filter(pk=pk))
            if error is not None:
                reason = " ".join(error.messages) if isinstance(error, ValidationError) else error
                malformed = Malformed(field.name, f"its own model cannot read it ({reason}).")
                malformed.entries.append(f"{label} pk {pk!r}")
                return malformed
    return Malformed(None, f"Some {label} rows cannot be read by their model.")


def _read_error(queryset: QuerySet[Any]) -> Exception | None:
    try:
        with transaction.atomic(using=queryset.db):  # a savepoint, as in _records()
            list(queryset)
    except _UNREADABLE as exc:
        return exc
    return None
