"""What a schedule row held when loaded or last saved, to tell what a save changes: whether
its cursor must move (a trigger field changed), whether it makes a new revision, and what
its version records (models/changes/versioning.py)."""

import copy
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Self

from django.db import models
from django.db.models import DEFERRED

from django_periodic.models.changes import versioning
from django_periodic.models.field_groups import CURSOR_FIELDS, REVISION_FIELDS

if TYPE_CHECKING:
    from django_periodic.models.changes.versions import ScheduleVersion


def _copy_if_mutable(value: Any) -> Any:
    if isinstance(value, list | dict):
        return copy.deepcopy(value) if value else type(value)()  # most args are empty
    return value


class TrackedChanges(models.Model):
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
    _last_version: "ScheduleVersion | None" = None

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
            name: versioning.recorded(name, self.__dict__[name])
            for name in versioning.COLUMNS
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
            name: versioning.recorded(name, loaded[name])
            for name in versioning.COLUMNS
            if name in loaded and loaded[name] is not DEFERRED
        }

    def _remember_versioned(self, fields: dict[str, Any]) -> None:
        """After a version: the versioned fields as it recorded them."""
        self._versioned = fields

    def _trigger_state(self) -> dict[str, Any]:
        # Deferred fields are left out: reading one would load the instance again.
        return {name: self.__dict__[name] for name in CURSOR_FIELDS if name in self.__dict__}
