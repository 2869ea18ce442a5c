"""An idle scheduler's periodic passes cost the same statements whatever the number of
schedules: the look ahead, the heartbeat, the sweep (expired leases, undeployed jobs, queued
runs, late fires, forgotten processes), judging attention and self-pausing, and retention
(versions are trimmed as they are written, so its pass walks no schedule)."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.db import clock
from django_periodic.engine import fleet, overlap
from django_periodic.engine.loop.scheduler import look_ahead
from django_periodic.engine.planning import attention
from django_periodic.engine.runs import claims, leases
from django_periodic.models import Schedule, SchedulerProcess
from django_periodic.operations import pruner
from tests.factories import SchedulerProcessFactory

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def more_schedules(count: int) -> None:
    """``count`` idle schedules more, bulk created (as an import of many would be)."""
    start = Schedule.objects.count()
    Schedule.objects.bulk_create(
        Schedule(name=f"idle-{start + i}", job="tests.jobs.noop", interval=HOUR)
        for i in range(count)
    )


def heartbeat() -> None:
    process = SchedulerProcess.objects.first() or SchedulerProcessFactory()
    leases.heartbeat(process, clock.now(), (), "default")


def sweep() -> None:
    now = clock.now()
    leases.sweep(now, "default", orphans=True)
    fleet.skip_undeployed(now, "default")
    overlap.promote_queued("default", None)
    claims.skip_late(now, "default")
    SchedulerProcess.objects.stale(now).forgettable().delete()


PASSES: dict[str, Callable[[], object]] = {
    "look ahead": lambda: look_ahead("default", judge=True),
    "heartbeat": heartbeat,
    "sweep": sweep,
    "attention and self-pausing": lambda: attention.evaluate(clock.now(), "default"),
    "retention": lambda: pruner.Pruner("default").prune_once(),
}


@pytest.mark.parametrize("name", PASSES)
def test_an_idle_pass_costs_the_same_at_10_and_1000_schedules(name):
    run_pass = PASSES[name]

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            run_pass()
        return len(captured.captured_queries)

    more_schedules(10)
    run_pass()  # the first pass may register or settle what the next ones find settled
    few = statements()
    more_schedules(990)
    assert statements() == few
