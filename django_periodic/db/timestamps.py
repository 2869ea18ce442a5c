"""Loading a batch of rows with each distinct timestamp parsed once (PostgreSQL, psycopg 3).

Django loads ``timestamptz`` values with a loader written in Python (it subclasses
psycopg's to set the time zone): about 5 µs a value, a fifth of the planner's client time
with 100,000 schedules due. The schedules of a batch mostly share a few cursors and
anchors, so parsing each distinct text once per result costs a dictionary look-up per
value instead. The results are the same objects Django would build (datetimes are
immutable, so rows may share them).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_periodic.db import features

if TYPE_CHECKING:
    from psycopg.abc import AdaptContext, Buffer
    from psycopg.adapt import Loader


@contextmanager
def timestamps_parsed_once(using: str) -> Iterator[None]:
    """While in this block, queries on ``using`` parse each distinct timestamp once per result.

    Does nothing but on PostgreSQL with psycopg 3. Only this connection is affected, and
    only until the block ends.
    """
    connection = connections[using]
    adapters = getattr(connection.connection, "adapters", None)  # psycopg 2 has none
    if not features(using).has_psycopg or adapters is None:
        yield
        return
    from psycopg.pq import Format

    oid = adapters.types["timestamptz"].oid
    loader = adapters.get_loader(oid, Format.TEXT)
    if loader is None:
        yield
        return
    # The cursors Django creates in the block copy the connection's loaders.
    adapters.register_loader(oid, _parsed_once(loader))
    try:
        yield
    finally:
        adapters.register_loader(oid, loader)


@cache
def _parsed_once(loader: "type[Loader]") -> "type[Loader]":
    """A subclass of ``loader`` (so Django still finds its time zone on it) that remembers
    what it parsed: a loader instance serves one result."""

    def __init__(self: Any, oid: int, context: "AdaptContext | None" = None) -> None:
        loader.__init__(self, oid, context)
        self.parsed = {}

    def load(self: Any, data: "Buffer") -> Any:
        key = bytes(data)
        value = self.parsed.get(key)
        if value is None:
            value = self.parsed[key] = loader.load(self, data)
        return value

    namespace = {"__init__": __init__, "load": load, "__module__": __name__}
    return type(f"ParsedOnce{loader.__name__}", (loader,), namespace)
