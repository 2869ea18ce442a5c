"""Recording versions: what a save of a schedule changed (``VERSIONED_FIELDS``), who made it
and why, written as a ``ScheduleVersion`` in the save's own transaction.

Who and why reach ``save()`` through ``changed_by()``, a context manager (a context variable,
so each thread and task has its own); without one, a version is by this process
("pid@host"). Values are stored as JSON: times in UTC and durations in ISO 8601; a secret
(``SECRET_FIELDS``, a ping URL) as a fingerprint, which tells that it changed, never what it
is (``recorded()``).
"""

import copy
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import transaction
from django.db.models import QuerySet
from django.utils.crypto import salted_hmac
from django.utils.duration import duration_iso_string

from django_periodic.models.changes.versions import ScheduleVersion
from django_periodic.models.field_groups import SECRET_FIELDS, VERSIONED_FIELDS

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule

# The versioned columns; the calendars are a many-to-many, recorded by name.
COLUMNS = tuple(name for name in VERSIONED_FIELDS if name != "calendars")
REASON_MAX_LENGTH = 500


class Author(NamedTuple):
    by: str
    reason: str


_author: ContextVar[Author | None] = ContextVar("django_periodic_version_author", default=None)


@contextmanager
def changed_by(by: str, reason: str = "") -> Iterator[None]:
    """Saves of schedules inside this block make versions by ``by``, for ``reason``."""
    token = _author.set(Author(by, reason[:REASON_MAX_LENGTH]))
    try:
        yield
    finally:
        _author.reset(token)


def author() -> Author:
    """Who and why, as ``changed_by()`` says; else this process, as "pid@host"."""
    return _author.get() or Author(f"{os.getpid()}@{socket.gethostname()}", "")


def _signed(by: str | None, reason: str | None) -> Author:
    """Who and why: as given, else as ``author()`` says."""
    who = author()
    reason = who.reason if reason is None else reason
    return Author(who.by if by is None else by, reason[:REASON_MAX_LENGTH])


def as_json(value: Any) -> Any:
    """A field's value as stored in a version: times in UTC ISO 8601, durations too."""
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, timedelta):
        return duration_iso_string(value)
    if isinstance(value, list | dict):
        return copy.deepcopy(value)  # args and kwargs, which may be changed in place
    return value


def fingerprint(secret: str) -> str:
    """A secret as a version records it: "" for none, else "(set <12 hex digits>)", an HMAC
    keyed by SECRET_KEY, which differs when the secret does and cannot be turned back into
    it."""
    if not secret:
        return ""
    digest = salted_hmac("django_periodic.versions.secret", secret, algorithm="sha256")
    return f"(set {digest.hexdigest()[:12]})"


def recorded(name: str, value: Any) -> Any:
    """A versioned field's value as a version records it: ``as_json()``, a secret's
    ``fingerprint()``."""
    return fingerprint(value) if name in SECRET_FIELDS else as_json(value)


def state_of(schedule: "Schedule") -> dict[str, Any]:
    """The versioned columns of ``schedule`` as they are in memory, as JSON."""
    return {name: recorded(name, getattr(schedule, name)) for name in COLUMNS}


def _before(schedule: "Schedule", names: Iterable[str], using: str) -> dict[str, Any]:
    """What the row held for ``names``, as JSON: as loaded or last saved; a field deferred
    when loaded is read now."""
    known = schedule._loaded_values()
    missing = [name for name in names if name not in known]
    if missing:
        row = type(schedule).objects.using(using).filter(pk=schedule.pk).values(*missing).get()
        known = {**known, **{name: recorded(name, value) for name, value in row.items()}}
    return known


def pending(
    schedule: "Schedule", update_fields: Iterable[str] | None, using: str
) -> dict[str, list[Any]]:
    """The changes ``{field: [old, new]}`` that saving ``schedule`` writes: every versioned
    column, from None, for a new one."""
    if schedule._state.adding:
        return {name: [None, value] for name, value in state_of(schedule).items()}
    written = set(COLUMNS) if update_fields is None else set(COLUMNS) & set(update_fields)
    deferred = schedule.get_deferred_fields()
    names = [name for name in COLUMNS if name in written and name not in deferred]
    if not names:
        return {}
    old = _before(schedule, names, using)
    new = {name: recorded(name, getattr(schedule, name)) for name in names}
    return {name: [old[name], new[name]] for name in names if old[name] != new[name]}


@contextmanager
def recording(schedule: "Schedule", save_kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Around ``Schedule.save()``'s write: if it changes a versioned field, the write and
    its version commit together (the revision read back in that transaction, so that two
    concurrent edits make two versions, each with its own)."""
    using = save_kwargs.get("using") or schedule._state.db or "default"
    schedule._last_version = None
    changes = pending(schedule, save_kwargs.get("update_fields"), using)
    if not changes:
        yield
        return
    with transaction.atomic(using=using):
        yield
        record(schedule, changes, using=using)


def record(
    schedule: "Schedule",
    changes: dict[str, list[Any]],
    *,
    using: str | None = None,
    by: str | None = None,
    reason: str | None = None,
) -> ScheduleVersion:
    """Write the version of ``schedule`` that ``changes`` made, with the row as it is now
    (its fields and revision read back). ``by`` and ``reason`` default to ``author()``."""
    using = using or schedule._state.db or "default"
    row = type(schedule).objects.using(using).filter(pk=schedule.pk)
    values = row.values(*COLUMNS, "revision").get()
    revision = values.pop("revision")
    fields = {name: recorded(name, value) for name, value in values.items()}
    fields["calendars"] = calendar_names(schedule, using)
    who = _signed(by, reason)
    version = ScheduleVersion.objects.using(using).create(
        schedule_id=schedule.pk,
        revision=revision,
        by=who.by,
        reason=who.reason,
        changes=changes,
        fields=fields,
    )
    schedule._remember_versioned(fields)
    schedule._last_version = version
    return version


def calendar_names(schedule: "Schedule", using: str) -> list[str]:
    """The names of its calendars, sorted (none for a new schedule)."""
    calendars = schedule.calendars.model.objects.using(using).filter(schedules=schedule.pk)
    return sorted(calendars.values_list("name", flat=True))


def record_calendars(schedule: "Schedule", old: list[str], using: str) -> None:
    """After its calendars were saved (the admin's ``save_related()``): the change of them
    joins the version its save just made, else makes one of its own."""
    new = calendar_names(schedule, using)
    if sorted(old) == new:
        return
    change = {"calendars": [sorted(old), new]}
    version = schedule._last_version
    if version is None or version._state.db != using:
        record(schedule, change, using=using)
        return
    version.changes = {**version.changes, **change}
    version.fields = {**version.fields, "calendars": new}
    version.save(update_fields=["changes", "fields"])


def update_versioned(
    queryset: "QuerySet[Schedule]",
    *,
    by: str | None = None,
    reason: str | None = None,
    **values: Any,
) -> int:
    """``update(**values)`` of these schedules that records a version of each row it changes
    (``update()`` itself makes none). As ``update()``, it bypasses ``save()``: the cursor
    stays where it is. Returns how many rows it updated."""
    using = queryset.db
    model = queryset.model
    with transaction.atomic(using=using):
        rows = queryset.select_for_update().order_by().values("pk", *COLUMNS)
        before = {row.pop("pk"): row for row in rows}
        updated = model.objects.using(using).filter(pk__in=before).update(**values)
        after = model.objects.using(using).filter(pk__in=before).values("pk", "revision", *COLUMNS)
        names = _calendar_names_of(queryset, list(before))
        who = _signed(by, reason)
        versions = []
        for row in after:
            pk, revision = row.pop("pk"), row.pop("revision")
            fields = {name: recorded(name, value) for name, value in row.items()}
            old = {name: recorded(name, value) for name, value in before[pk].items()}
            changes = {k: [old[k], v] for k, v in fields.items() if old[k] != v}
            if changes:
                versions.append(
                    ScheduleVersion(
                        schedule_id=pk,
                        revision=revision,
                        by=who.by,
                        reason=who.reason,
                        changes=changes,
                        fields={**fields, "calendars": names.get(pk, [])},
                    )
                )
        ScheduleVersion.objects.using(using).bulk_create(versions)
    return updated


def _calendar_names_of(queryset: "QuerySet[Schedule]", pks: list[int]) -> dict[int, list[str]]:
    """The names of the calendars of each of these schedules, sorted, in one query."""
    through = queryset.model.calendars.through.objects.using(queryset.db)
    pairs = through.filter(schedule_id__in=pks).order_by("calendar__name")
    names: dict[int, list[str]] = {}
    for pk, name in pairs.values_list("schedule_id", "calendar__name"):
        names.setdefault(pk, []).append(name)
    return names
