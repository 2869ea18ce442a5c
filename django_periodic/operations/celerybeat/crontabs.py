"""Celery's crontabs as cron expressions: django-celery-beat's text fields, or a
``celery.schedules.crontab`` object of a ``beat_schedule``.

Celery fires on the days that match ``day_of_month`` *and* ``day_of_week``; cron (Vixie's
rule, as ``timing/triggers.py`` reads it) on days matching either, unless one of the two
starts with ``*``. A crontab restricting both has no cron equivalent: it is unmappable.
"""

from collections.abc import Iterable
from typing import Any

from django_periodic.operations.celerybeat.applying import Unmappable
from django_periodic.operations.celerybeat.rows import CRON_FIELDS
from django_periodic.timing import triggers
from django_periodic.timing.cron_fields import FIELDS, FieldError, item_values, step

# The values of each field in celery (day_of_week 0-6, Sunday = 0).
CELERY_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def cron_values(parts: list[str], timezone: str) -> dict[str, Any]:
    """The schedule values of a crontab whose fields, in cron's order, are ``parts``.

    Raises Unmappable for one that cron reads otherwise, or not at all."""
    expression = " ".join(parts)
    if not (parts[2].startswith("*") or parts[4].startswith("*")):
        raise Unmappable(
            f"crontab {expression!r}: celery fires on days matching both day_of_month and "
            "day_of_week, cron on days matching either; split it into two schedules, or "
            "check the day in the job."
        )
    try:
        triggers.validate_cron(expression)
    except triggers.InvalidTrigger as exc:
        raise Unmappable(f"crontab {expression!r} ({timezone}): {exc}") from None
    return {"cron": expression, "timezone": timezone}


def celery_cron_parts(crontab: Any) -> list[str]:
    """The cron fields of a ``celery.schedules.crontab``: each as the crontab was written
    where cron reads that text as the same values (``"*/15"``, ``"mon-fri"``), else the
    values celery expanded it to (an int, a list or set, a wrapping range ``"22-2"``)."""
    parts = []
    for index, key in enumerate(CRON_FIELDS):
        values = frozenset(getattr(crontab, key))
        written = getattr(crontab, f"_orig_{key}")
        text = written.replace(" ", "") if isinstance(written, str) else None
        if text is None or cron_field_values(text, index) != values:
            text = compact(values, *CELERY_RANGES[index])
        parts.append(text)
    return parts


def celery_text_part(text: str, index: int) -> str:
    """Field ``index`` of a crontab written as ``text`` (django-celery-beat's column): as
    written where cron reads it, else the values celery reads in it, such as a range it
    wraps (hour ``22-2``: ``0-2,22,23``); as written if celery cannot read it either (the
    cron check then names the field)."""
    if cron_field_values(text, index) is not None:
        return text
    values = celery_field_values(text, index)
    return text if values is None else compact(values, *CELERY_RANGES[index])


def celery_field_values(text: str, index: int) -> frozenset[int] | None:
    """The values celery reads in field ``index`` written as ``text``: cron's, except that a
    reversed range wraps past the field's end, as celery's parser wraps it (``22-2/2``: 22,
    0, 2); None if it cannot be read."""
    values: set[int] = set()
    for item in text.split(","):
        read = cron_field_values(item, index)
        if read is None:
            read = _wrapped(item, index)
        if read is None:
            return None
        values |= read
    return frozenset(values)


def _wrapped(item: str, index: int) -> frozenset[int] | None:
    low, high = CELERY_RANGES[index]
    base, slash, step_text = item.partition("/")
    first_text, dash, last_text = base.partition("-")
    first, last = cron_field_values(first_text, index), cron_field_values(last_text, index)
    if not dash or not first or not last or len(first) != 1 or len(last) != 1:
        return None
    try:
        every = step(step_text, low, high) if slash else 1
    except FieldError:
        return None
    start, end = min(first), min(last)
    ordered = [*range(start, high + 1), *range(low, end + 1)] if start > end else []
    return frozenset(ordered[::every]) or None


def cron_field_values(text: str, index: int) -> frozenset[int] | None:
    """The values cron reads in field ``index`` written as ``text``; None if it cannot."""
    _, low, high, names = FIELDS[index]
    try:
        values = {v for item in text.split(",") for v in item_values(item, low, high, names)}
    except FieldError:
        return None
    return frozenset(v % 7 for v in values) if index == 4 else frozenset(values)


def compact(values: Iterable[int], low: int, high: int) -> str:
    """Values of a cron field as short text: ``*`` for all, else runs (``0-2,22,23``).

    Never ``*/step``: a field starting with ``*`` changes how cron reads the day fields
    and DST (``timing/triggers.py``), which the crontab's values alone do not ask for."""
    ordered = sorted(set(values))
    if ordered == list(range(low, high + 1)):
        return "*"
    runs: list[list[int]] = []
    for value in ordered:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)
