"""Versions: one row for every change of a schedule made through the app's surface (the
admin, ``save()``, code-defined schedules synced at start, pause and resume, the importer),
with who made it, why, and the changes field by field. ``QuerySet.update()`` bypasses
``save()`` and so makes none (docs/versions.md). A schedule keeps its newest
``KEEP_VERSIONS``: the older ones are deleted as a new one is written, in its transaction
(``trim()``), so that retention never has to walk the schedules.

Recording versions: what a save of a schedule changed (``VERSIONED_FIELDS``), who made it
and why, written as a ``ScheduleVersion`` in the save's own transaction.

Who and why reach ``save()`` through ``changed_by()``, a context manager (a context variable,
so each thread and task has its own); without one, a version is by this process
("pid@host"). Values are stored as JSON: times in UTC and durations in ISO 8601; a secret
(``SECRET_FIELDS``, a ping URL) as a fingerprint, which tells that it changed, never what it
is (``recorded()``).

Concurrency limits are versioned by the same rules (``LimitVersion``, models/limits.py):
who and why, values as JSON, changes field by field (``diff()``), trimmed to
``KEEP_VERSIONS`` as each is written (``trim_versions()``).

What a schedule row held when loaded or last saved, to tell what a save changes: whether
its cursor must move (a trigger field changed), whether it makes a new revision, and what
its version records: ``TrackedChanges``, the mixin that remembers it.
"""

import copy
import os
import socket
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Self

from django.db import models, transaction
from django.db.models import DEFERRED, F, QuerySet, Window
from django.db.models.functions import Now, RowNumber
from django.utils.crypto import salted_hmac
from django.utils.duration import duration_iso_string
from django.utils.translation import gettext_lazy as _

from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.models.schedule_fields import (
    CURSOR_FIELDS,
    REVISION_FIELDS,
    SECRET_FIELDS,
    VERSIONED_FIELDS,
    ScheduleFields,
)

# The versioned columns, by attribute name (a concurrency limit by its id); the calendars
# are a many-to-many, recorded by name.
_FIELDS = {field.name: field for field in ScheduleFields._meta.concrete_fields}
COLUMNS = tuple(_FIELDS[name].attname for name in VERSIONED_FIELDS if name != "calendars")
REASON_MAX_LENGTH = 500


class Version(models.Model):
    """What every version records: when, who, why, the changes field by field, and the
    versioned fields as the change left them."""

    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now())
    by = models.CharField(
        max_length=150,
        blank=True,
        default="",
        db_default="",
        help_text=_('Who made it: a user, or "code", "import", a process.'),
    )
    reason = models.CharField(max_length=REASON_MAX_LENGTH, blank=True, default="", db_default="")
    # {field: [old, new]}, as JSON values (times and durations as ISO 8601 text).
    changes = models.JSONField(default=dict, db_default={}, blank=True)
    # The versioned fields as this change left them: what "restore this version" writes.
    fields = models.JSONField(default=dict, db_default={}, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]


class ScheduleVersion(Version):
    """A schedule as one change left it: its revision, when, who, why, and what changed."""

    schedule = models.ForeignKey(
        "django_periodic.Schedule", on_delete=models.CASCADE, related_name="versions"
    )
    revision = models.PositiveIntegerField(
        help_text=_("The schedule's revision after this change; its runs record theirs.")
    )

    class Meta(Version.Meta):
        indexes = [
            models.Index(fields=["schedule", "-created_at"], name="periodic_version_schedule"),
            # A schedule's versions in the order they were recorded: trim() reads its
            # newest KEEP_VERSIONS and no more.
            models.Index(fields=["schedule", "-id"], name="periodic_version_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.created_at:%Y-%m-%d %H:%M:%S}"


def _copy_if_mutable(value: Any) -> Any:
    if isinstance(value, list | dict):
        return copy.deepcopy(value) if value else type(value)()  # most args are empty
    return value


class TrackedChanges(ScheduleFields):
    """A model that remembers its ``CURSOR_FIELDS`` and ``REVISION_FIELDS`` as loaded, and
    the row it was loaded from, which its next version is diffed against."""

    # The trigger fields as loaded or last saved (see from_db); absent on a new instance.
    _loaded_trigger: dict[str, Any]
    # The revision fields likewise (deferred ones left out: reading them would query).
    _loaded_revision: dict[str, Any]
    # The row as loaded, (field names, values): kept as Django gives it, and read only when
    # a save is versioned, so that loading stays cheap (every claimed run loads its schedule).
    _loaded_row: tuple[Collection[str], Collection[Any]] | None = None
    # The versioned fields as JSON, as the last version recorded them (it supersedes the row).
    _versioned: dict[str, Any] | None = None
    # The version its last save made (None: none), which the admin's save_related() completes.
    _last_version: ScheduleVersion | None = None

    class Meta:
        abstract = True

    def _remember_saved(self, update_fields: Iterable[str] | None) -> None:
        """After a save: what the row holds now."""
        self._loaded_trigger = self._saved(self._trigger_state(), "_loaded_trigger", update_fields)
        self._loaded_revision = self._saved(
            self._revision_state(), "_loaded_revision", update_fields
        )

    def _changed_cursor_fields(self) -> set[str]:
        """The ``CURSOR_FIELDS`` whose value differs from the row's."""
        loaded = getattr(self, "_loaded_trigger", None) or {}
        current = self._trigger_state()
        missing = object()  # deferred when loaded, set since: counts as a change
        return {name for name in current if loaded.get(name, missing) != current[name]}

    def _saved(
        self, current: dict[str, Any], loaded: str, update_fields: Iterable[str] | None
    ) -> dict[str, Any]:
        """The values as stored now: those written, the loaded ones for the others."""
        if update_fields is None:
            return current
        written = {k: v for k, v in current.items() if k in set(update_fields)}
        return {**getattr(self, loaded, {}), **written}

    def _revised(self, update_fields: Iterable[str] | None) -> bool:
        """Whether this save writes a new value to one of ``REVISION_FIELDS``."""
        if self._state.adding:
            return False
        loaded = getattr(self, "_loaded_revision", {})
        written = REVISION_FIELDS if update_fields is None else set(update_fields)
        missing = object()  # deferred when loaded, set since: counts as a change
        current = self._revision_state()
        return any(
            loaded.get(name, missing) != current[name]
            for name in REVISION_FIELDS
            if name in written and name in current
        )

    def _revision_state(self) -> dict[str, Any]:
        # Copies of args and kwargs, which may be changed in place; the other fields hold
        # immutable values. Every claimed run loads its schedule: this stays cheap.
        return {
            name: _copy_if_mutable(self.__dict__[name])
            for name in REVISION_FIELDS
            if name in self.__dict__
        }

    @classmethod
    def from_db(
        cls,
        db: str | None,
        field_names: Collection[str],
        values: Collection[Any],
        *args: Any,
        **kwargs: Any,
    ) -> Self:
        instance = super().from_db(db, field_names, values, *args, **kwargs)
        instance._loaded_trigger = instance._trigger_state()
        instance._loaded_revision = instance._revision_state()
        instance._loaded_row = (field_names, values)
        return instance

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        # What it reads is what the row holds now: the next version is diffed against it.
        super().refresh_from_db(*args, **kwargs)
        fields = kwargs.get("fields") or (args[1] if len(args) > 1 else None)
        read = {
            name: recorded(name, self.__dict__[name])
            for name in COLUMNS
            if name in self.__dict__ and (fields is None or name in fields)
        }
        self._versioned = {**self._loaded_values(), **read}

    def _loaded_values(self) -> dict[str, Any]:
        """The versioned fields as loaded or last versioned, as JSON (deferred ones left out)."""
        if self._versioned is not None:
            return self._versioned
        if self._loaded_row is None:
            return {}
        loaded = dict(zip(*self._loaded_row, strict=True))
        loaded.update(getattr(self, "_loaded_revision", {}))  # copies of args and kwargs
        return {
            name: recorded(name, loaded[name])
            for name in COLUMNS
            if name in loaded and loaded[name] is not DEFERRED
        }

    def _remember_versioned(self, fields: dict[str, Any]) -> None:
        """After a version: the versioned fields as it recorded them."""
        self._versioned = fields

    def _trigger_state(self) -> dict[str, Any]:
        # Deferred fields are left out: reading one would load the instance again.
        return {name: self.__dict__[name] for name in CURSOR_FIELDS if name in self.__dict__}


class Author(NamedTuple):
    by: str
    reason: str


_author: ContextVar[Author | None] = ContextVar("django_periodic_version_author", default=None)


@contextmanager
def changed_by(by: str, reason: str = "") -> Iterator[None]:
    """Saves of schedules and of concurrency limits inside this block make versions by
    ``by``, for ``reason``."""
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


def diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The changes ``{field: [old, new]}`` from ``old`` to ``new`` (JSON values): those that
    differ; every field, from None, when there was no ``old`` (a new row)."""
    if old is None:
        return {name: [None, value] for name, value in new.items()}
    return {name: [old[name], value] for name, value in new.items() if old[name] != value}


def state_of(schedule: "TrackedChanges") -> dict[str, Any]:
    """The versioned columns of ``schedule`` as they are in memory, as JSON."""
    return {name: recorded(name, getattr(schedule, name)) for name in COLUMNS}


def _before(schedule: "TrackedChanges", names: Iterable[str], using: str) -> dict[str, Any]:
    """What the row held for ``names``, as JSON: as loaded or last saved; a field deferred
    when loaded is read now."""
    known = schedule._loaded_values()
    missing = [name for name in names if name not in known]
    if missing:
        row = (
            type(schedule)
            ._default_manager.using(using)
            .filter(pk=schedule.pk)
            .values(*missing)
            .get()
        )
        known = {**known, **{name: recorded(name, value) for name, value in row.items()}}
    return known


def pending(
    schedule: "TrackedChanges", update_fields: Iterable[str] | None, using: str
) -> dict[str, list[Any]]:
    """The changes ``{field: [old, new]}`` that saving ``schedule`` writes: every versioned
    column, from None, for a new one."""
    if schedule._state.adding:
        return diff(None, state_of(schedule))
    written = set(COLUMNS) if update_fields is None else set(COLUMNS) & set(update_fields)
    deferred = schedule.get_deferred_fields()
    names = [name for name in COLUMNS if name in written and name not in deferred]
    if not names:
        return {}
    old = _before(schedule, names, using)
    new = {name: recorded(name, getattr(schedule, name)) for name in names}
    return diff(old, new)


@contextmanager
def recording(schedule: "TrackedChanges", save_kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Around ``Schedule.save()``'s write: if it changes a versioned field, the write and
    its version commit together (the revision read back in that transaction, so that two
    concurrent edits make two versions, each with its own)."""
    using = save_kwargs.get("using") or schedule._state.db or "default"
    schedule._last_version = None
    changes = pending(schedule, save_kwargs.get("update_fields"), using)
    if not changes:
        yield
        return
    new = schedule._state.adding  # its first version: none older to trim
    with transaction.atomic(using=using):
        yield
        record(schedule, changes, using=using, trimming=not new)


def record(
    schedule: "TrackedChanges",
    changes: dict[str, list[Any]],
    *,
    using: str | None = None,
    by: str | None = None,
    reason: str | None = None,
    trimming: bool = True,
) -> ScheduleVersion:
    """Write the version of ``schedule`` that ``changes`` made, with the row as it is now
    (its fields and revision read back), and, ``trimming``, delete its versions past the
    newest ``KEEP_VERSIONS`` in the same transaction. ``by`` and ``reason`` default to
    ``author()``."""
    using = using or schedule._state.db or "default"
    row = type(schedule)._default_manager.using(using).filter(pk=schedule.pk)
    values = row.values(*COLUMNS, "revision").get()
    revision = values.pop("revision")
    fields = {name: recorded(name, value) for name, value in values.items()}
    fields["calendars"] = calendar_names(schedule, using)
    who = _signed(by, reason)
    with transaction.atomic(using=using, savepoint=False):
        version = ScheduleVersion.objects.using(using).create(
            schedule_id=schedule.pk,
            revision=revision,
            by=who.by,
            reason=who.reason,
            changes=changes,
            fields=fields,
        )
        if trimming:
            trim([schedule.pk], using)
    schedule._remember_versioned(fields)
    schedule._last_version = version
    return version


def calendar_names(schedule: "TrackedChanges", using: str) -> list[str]:
    """The names of its calendars, sorted (none for a new schedule)."""
    calendars = schedule.calendars.model._default_manager.using(using).filter(schedules=schedule.pk)
    return sorted(calendars.values_list("name", flat=True))


def record_calendars(schedule: "TrackedChanges", old: list[str], using: str) -> None:
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
    queryset: "QuerySet[Any]",
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
        updated: int = model._default_manager.using(using).filter(pk__in=before).update(**values)
        after = (
            model._default_manager.using(using)
            .filter(pk__in=before)
            .values("pk", "revision", *COLUMNS)
        )
        names = _calendar_names_of(queryset, list(before))
        who = _signed(by, reason)
        versions = []
        for row in after:
            pk, revision = row.pop("pk"), row.pop("revision")
            fields = {name: recorded(name, value) for name, value in row.items()}
            old = {name: recorded(name, value) for name, value in before[pk].items()}
            changes = diff(old, fields)
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
        trim([version.schedule_id for version in versions], using)
    return updated


def trim(schedule_pks: Collection[int], using: str) -> int:
    """Delete the versions of these schedules but the newest ``KEEP_VERSIONS`` of each;
    return how many went (``trim_versions()``)."""
    return trim_versions(ScheduleVersion, "schedule_id", schedule_pks, using)


def trim_versions(model: type[models.Model], owner: str, pks: Collection[Any], using: str) -> int:
    """Delete the versions (rows of ``model``) of these owners (``pks``, in the column
    ``owner``) but the newest ``KEEP_VERSIONS`` of each (by id: the order they were recorded
    in); return how many went. The versions of schedules and of concurrency limits alike.

    One statement, which reads each owner's newest versions on its index by (owner, -id),
    one past ``KEEP_VERSIONS`` when its versions are trimmed at each write. None at all with
    ``KEEP_VERSIONS = None``, or no owners.
    """
    keep = get_settings().KEEP_VERSIONS
    if keep is None or not pks:
        return 0
    old = older_versions(model, owner, keep, using, pks)
    return old.delete()[1].get(model._meta.label, 0)


def older_versions(
    model: type[models.Model],
    owner: str,
    keep: int,
    using: str,
    pks: Collection[Any] | None = None,
) -> "QuerySet[Any]":
    """The versions (rows of ``model``) of these owners (every one with None) past the newest
    ``keep`` of each, by id."""
    versions = model._default_manager.using(using)
    owned = versions.all() if pks is None else versions.filter(**{f"{owner}__in": set(pks)})
    newer = Window(RowNumber(), partition_by=F(owner), order_by=F("pk").desc())
    old = owned.annotate(newer=newer).filter(newer__gt=keep).values("pk")
    return versions.filter(pk__in=old)


def _calendar_names_of(queryset: "QuerySet[Any]", pks: list[int]) -> dict[int, list[str]]:
    """The names of the calendars of each of these schedules, sorted, in one query."""
    through = queryset.model.calendars.through.objects.using(queryset.db)
    pairs = through.filter(schedule_id__in=pks).order_by("calendar__name")
    names: dict[int, list[str]] = {}
    for pk, name in pairs.values_list("schedule_id", "calendar__name"):
        names.setdefault(pk, []).append(name)
    return names
