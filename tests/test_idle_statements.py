"""An idle scheduler's periodic passes cost the same statements whatever the number of
schedules, and on PostgreSQL read the same rows of the schedules table: the look ahead, the
heartbeat, the sweep (expired leases, undeployed jobs, queued runs, late fires, forgotten
processes), the deadline watcher (on the index of runs with a deadline), judging attention
and self-pausing (on the index of the schedules it judges), and retention (versions are
trimmed as they are written; the schedules with a count rule are walked by a pruner's first
pass only, a later one reads the changes since)."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_periodic.db import clock
from django_periodic.engine import fleet, overlap
from django_periodic.engine.loop.scheduler import Scheduler, look_ahead
from django_periodic.engine.planning import attention
from django_periodic.engine.runs import claims, deadlines, leases
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.operations import pruner
from tests.factories import ScheduleFactory, SchedulerProcessFactory

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# Retention rules for every kind of schedule: a count and an age rule for those that follow
# the settings, and a few schedules with rules of their own (made by the test).
RULES = {"KEEP_RUNS": 10, "KEEP_RUNS_FOR": 30 * DAY, "KEEP_FAILED_RUNS_FOR": 60 * DAY}
# The rows of the schedules table an idle pass may read, with 10 or with 1,000 schedules.
MOST_ROWS_READ = 10


def more_schedules(count: int) -> None:
    """``count`` idle schedules more, bulk created (as an import of many would be), each
    with a finished run that every rule keeps: history that a pass reading every schedule
    would read."""
    start = Schedule.objects.count()
    made = Schedule.objects.bulk_create(
        Schedule(name=f"idle-{start + i}", job="tests.jobs.noop", interval=HOUR)
        for i in range(count)
    )
    now = clock.now()
    Run.objects.bulk_create(
        Run(
            schedule=schedule,
            plan_time=now - HOUR,
            job_name=schedule.job,
            status=Run.Status.SUCCEEDED,
            finished_at=now - HOUR,
        )
        for schedule in made
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


def transactions_of(call: Callable[[], object]) -> int:
    """The transactions ``call`` makes: its outermost atomic blocks, and each statement it
    runs outside one (autocommit)."""
    outside: list[str] = []

    def note(execute, sql, params, many, context):
        if not connection.in_atomic_block and not sql.startswith("BEGIN"):  # SQLite's own
            outside.append(sql)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(note):
        call()
    begun = [q for q in captured.captured_queries if q["sql"].startswith("BEGIN")]
    return len(begun) + len(outside)


@pytest.mark.django_db(transaction=True)
def test_an_idle_wake_up_is_one_transaction_with_its_housekeeping_and_alerts():
    ScheduleFactory(alert_after=DAY, start_at=clock.now() + DAY)  # judged, not due
    scheduler = Scheduler(workers=0)
    scheduler.boot()
    # The heartbeat, the sweep and the judging of alerts are all due.
    housekeeper = scheduler.housekeeper
    housekeeper.next_heartbeat = housekeeper.next_sweep = clock.now()
    assert housekeeper.next_attention <= clock.now()
    assert transactions_of(scheduler.tick) == 1
    assert housekeeper.next_attention > clock.now()  # judged, in that transaction


def later_pruning_pass() -> Callable[[], object]:
    """A pruner's pass after its first (which walks the schedules with a count rule)."""
    process = pruner.Pruner("default")
    process.look_at_start()
    process.prune_once()
    return process.prune_once


PASSES: dict[str, Callable[[], Callable[[], object]]] = {
    "look ahead": lambda: lambda: look_ahead("default", judge=True),
    "heartbeat": lambda: heartbeat,
    "sweep": lambda: sweep,
    "attention and self-pausing": lambda: lambda: attention.evaluate(clock.now(), "default"),
    "deadlines": lambda: lambda: deadlines.flag_late(clock.now(), "default"),
    "a pruner's first pass, by age": lambda: pruner.Pruner("default").prune_once,
    "a pruner's later pass": later_pruning_pass,
}


def analyze() -> None:
    """Statistics, as autovacuum keeps them: without any, the planner cannot know how few
    rows a partial index holds (PostgreSQL)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Schedule._meta.db_table}, {Run._meta.db_table}")


def schedule_rows_read() -> int:
    """The rows of the schedules table that this transaction has read (PostgreSQL's
    statistics of the transaction in progress); 0 elsewhere."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
            "WHERE relid = %s::regclass",
            [Schedule._meta.db_table],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("configured", [{}, RULES], ids=["defaults", "retention rules"])
@pytest.mark.parametrize("name", PASSES)
def test_an_idle_pass_costs_the_same_at_10_and_1000_schedules(settings, name, configured):
    if name == "a pruner's first pass, by age" and "KEEP_RUNS" in configured:
        configured = {**configured, "KEEP_RUNS": None}  # with a count rule, it walks
    settings.DJANGO_PERIODIC = configured
    # Schedules with rules of their own (retention), with alerts, and self-pausing.
    ScheduleFactory(keep_runs=3)
    ScheduleFactory(keep_runs_for=DAY, keep_failed_runs_for=2 * DAY)
    ScheduleFactory(alert_after=DAY, alert_failures=3, pause_after_failures=5)

    def cost() -> tuple[int, int]:
        """Statements, and rows of the schedules table read, of an idle pass."""
        analyze()
        run_pass = PASSES[name]()
        run_pass()  # the first may register or settle what the next ones find settled
        read = schedule_rows_read()
        with CaptureQueriesContext(connection) as captured:
            run_pass()
        return len(captured.captured_queries), schedule_rows_read() - read

    more_schedules(10)
    few = cost()
    more_schedules(990)
    many = cost()
    assert many[0] == few[0]
    # The schedules with rules or alerts of their own, and a row or two the database may
    # fetch on its way (0 on SQLite, which keeps no such statistics). With 13 schedules in
    # all, PostgreSQL may rightly scan the whole table instead of an index; with 1,003 it
    # must not.
    assert few[1] <= max(MOST_ROWS_READ, Schedule.objects.count() - 990)
    assert many[1] <= MOST_ROWS_READ
