"""PostgreSQL array literals: a batch's values sent as one text parameter each.

A set-based statement takes a batch as arrays (``unnest(%s::bigint[])``, ``= ANY(...)``).
Sending each array as one literal string, cast in SQL, costs far less than one parameter
per value: psycopg adapts and quotes a list element by element in Python, Django
processes every ``IN`` parameter, and PostgreSQL parses each one as a constant.
"""

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID


def literal(values: list[Any]) -> str:
    """An array literal of ints, bools, texts or aware datetimes (NULL for None)."""
    return "{" + ",".join(map(_element, values)) + "}"


def integers(values: list[int]) -> str:
    """``literal`` of ints only (one per schedule or run), without a type test per value."""
    return "{" + ",".join(map(str, values)) + "}"


def uuids(values: Iterable[UUID]) -> str:
    """``literal`` of UUIDs (lease tokens), which need no quoting."""
    return "{" + ",".join(map(str, values)) + "}"


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
