"""``fire_times()`` and ``assert_fire_times()``: a schedule's fire times over a range, from the
pure trigger math the planner uses (no database)."""

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django_periodic.models import Schedule
from django_periodic.models.calendars import closures_of
from django_periodic.models.trigger_rows import open_trigger_of
from django_periodic.timing import triggers

# More fires than this in one range is a mistake (a minute cron over years), not a test.
MAX_FIRES = 10_000

Spec = Schedule | triggers.Trigger | str


def fire_times(
    spec: Spec, start: datetime, end: datetime, *, timezone: str = "UTC"
) -> list[datetime]:
    """The fire times of ``spec`` from ``start`` (included) to ``end`` (excluded), aware UTC.

    ``spec`` is a schedule (saved or not: ``Schedule(cron="30 2 * * *", timezone=...)``), a
    trigger, or a cron expression evaluated in ``timezone``. A saved schedule's fires are
    those that run: its calendars' closed fires are left out or shifted. ``start`` and ``end`` are
    aware datetimes in any zone.
    """
    trigger = _trigger(spec, timezone)
    fires: list[datetime] = []
    after = start - timedelta(microseconds=1)
    while (fire := trigger.next_after(after)) is not None and fire < end:
        if len(fires) == MAX_FIRES:
            raise ValueError(f"More than {MAX_FIRES} fire times from {start} to {end}.")
        fires.append(fire)
        after = fire
    return fires


def assert_fire_times(
    spec: Spec,
    start: datetime,
    end: datetime,
    expected: Iterable[datetime],
    *,
    timezone: str = "UTC",
) -> None:
    """Assert that ``spec`` fires exactly at ``expected`` from ``start`` to ``end`` (see
    ``fire_times``); the error lists the missing and unexpected times, in UTC and local."""
    actual = fire_times(spec, start, end, timezone=timezone)
    wanted = sorted(e.astimezone(UTC) for e in expected)
    if actual == wanted:
        return
    zone = _zone(spec, timezone)
    missing = [t for t in wanted if t not in actual]
    unexpected = [t for t in actual if t not in wanted]
    lines = [f"Fire times of {_describe(spec, timezone)} from {start} to {end} differ:"]
    lines += [f"  missing:    {_show(t, zone)}" for t in missing]
    lines += [f"  unexpected: {_show(t, zone)}" for t in unexpected]
    if not missing and not unexpected:
        lines.append("  (a time expected more than once)")
    lines.append(f"  actual: {[_show(t, zone) for t in actual]}")
    raise AssertionError("\n".join(lines))


def _trigger(spec: Spec, timezone: str) -> triggers.Trigger:
    if isinstance(spec, Schedule):
        return open_trigger_of(spec, closures_of(spec))
    if isinstance(spec, str):
        return triggers.cron(spec, timezone)
    return spec


def _zone(spec: Spec, timezone: str) -> ZoneInfo:
    if isinstance(spec, Schedule) and (spec.cron or spec.rrule):  # read on its wall clock
        return triggers.parse_timezone(spec.timezone)
    return triggers.parse_timezone(timezone)


def _describe(spec: Spec, timezone: str) -> str:
    if isinstance(spec, Schedule):
        return f"schedule {spec.name or spec.cron or spec.rrule or spec.pk!r}"
    return f"{spec!r} ({timezone})" if isinstance(spec, str) else repr(spec)


def _show(moment: datetime, zone: ZoneInfo) -> str:
    local = moment.astimezone(zone)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({local:%Y-%m-%d %H:%M:%S %Z} {zone.key})"
