"""Small helpers that many test modules share, and what only tests ask of the package's
modules (which runs a prune deletes, which DST changes a trigger meets)."""

from datetime import UTC, datetime, timedelta
from io import StringIO

from django.core.management import call_command
from django.db import transaction
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.engine import records
from django_periodic.engine.planning import planner
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import claims
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.operations import prunable, retention
from django_periodic.timing import dst, triggers
from tests.factories import RunFactory, ScheduleFactory


def utc(*parts: int) -> datetime:
    """``datetime(*parts)`` in UTC."""
    return datetime(*parts, tzinfo=UTC)


def nested_lists(depth: int) -> list:
    """``depth`` lists, each inside the one before: ``[[[]]]`` for 3."""
    innermost: list = []
    for _ in range(depth - 1):
        innermost = [innermost]
    return innermost


def set_cursor(schedule: Schedule, at: datetime | None) -> None:
    """Store ``next_fire_at`` as it is, past ``save()``'s own computation of it."""
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=at)


def fire(schedule: Schedule, at: datetime) -> records.PlanResult:
    """Make ``schedule`` due at ``at`` and plan it."""
    set_cursor(schedule, at)
    return planner.plan_due(at)


def overdue_schedule(now: datetime, name: str = "overdue") -> Schedule:
    """An enabled schedule whose cursor passed longer ago than a live scheduler may stay
    silent."""
    schedule = ScheduleFactory(name=name)
    set_cursor(schedule, now - SchedulerProcess.stale_after() - timedelta(seconds=1))
    return schedule


def output_of(*args: str, **options: object) -> str:
    """What a management command prints."""
    out = StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def run_url(run: Run, view: str = "change") -> str:
    """The admin URL of a run's ``view``."""
    return reverse(f"admin:django_periodic_run_{view}", args=[run.pk])


def claimed(process: SchedulerProcess, now: datetime, **schedule_fields: object) -> Claim:
    """The claim of a run planned at ``now``, of a new schedule with ``schedule_fields``."""
    RunFactory(schedule=ScheduleFactory(**schedule_fields), plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    return claim


def prunable_runs(now: datetime, rules: prunable.Rules) -> list[int]:
    """The ids of the runs that ``retention.prune()`` deletes now under ``rules``: it prunes
    them in a transaction, which is then rolled back."""
    before = set(Run.objects.values_list("pk", flat=True))
    with transaction.atomic():
        for pruned in retention.prune(now, rules=rules):
            assert not pruned.busy
        left = set(Run.objects.values_list("pk", flat=True))
        transaction.set_rollback(True)
    return sorted(before - left)


def affected_changes(
    trigger: triggers.CronTrigger, start: datetime, end: datetime
) -> list[dst.AffectedChange]:
    """The changes of ``trigger``'s time zone after ``start``, up to ``end``, that skip or
    repeat some of its wall times (``dst.affected``), as the admin's preview finds them."""
    zone = triggers.parse_timezone(trigger.timezone)
    found = (dst.affected(trigger, change) for change in dst.offset_changes(zone, start, end))
    return [change for change in found if change is not None]


def far_hour() -> int:
    """An hour of the day 11 or 12 hours from now (UTC), before 23:00: a daily fire at it, an
    hour after it (the same day) or nine hours before it is far from the edges of the
    diff's window, which starts now, so each day's fire falls inside the window on both
    sides whatever the time of the test."""
    return min((clock.now().hour + 12) % 24, 22)
