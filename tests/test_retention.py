"""Retention: which finished runs are kept, how they are deleted (in bounded batches, one
process at a time), and that pruning never lets an old plan time fire again."""

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic import checks, job
from django_periodic.db import postgresql as pg
from django_periodic.engine.planning import code_schedules, planner
from django_periodic.models import Lease, Run, Schedule
from django_periodic.operations import prunable, pruner, retention
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory, schedule_form_data
from tests.helpers import prunable_runs, set_cursor
from tests.processes import wait_for
from tests.threads import Thread

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def finished_runs(schedule, now, ages, status=Run.Status.SUCCEEDED) -> list[Run]:
    """One finished run of ``schedule`` per age (how long before ``now`` it was planned)."""
    return [
        RunFactory(schedule=schedule, plan_time=now - age, status=status, finished_at=now)
        for age in ages
    ]


def ids(runs) -> list[int]:
    return sorted(run.pk for run in runs)


def prune_all(now, rules, **options) -> retention.Pruned:
    total = retention.Pruned()
    for batch in retention.prune(now, rules=rules, **options):
        total += batch
    return total


# -- the rules ---------------------------------------------------------------------------------


def test_without_a_rule_every_run_is_kept(now):
    finished_runs(ScheduleFactory(), now, [400 * DAY])
    assert prunable_runs(now, prunable.Rules()) == []


def test_keep_runs_keeps_the_last_n_finished_runs_of_each_schedule(now):
    first, second = ScheduleFactory(), ScheduleFactory()
    old_first = finished_runs(first, now, [5 * HOUR, 4 * HOUR])
    finished_runs(first, now, [3 * HOUR, 2 * HOUR])
    finished_runs(second, now, [9 * HOUR, 8 * HOUR])
    assert prunable_runs(now, prunable.Rules(keep_runs=2)) == ids(old_first)


def test_keep_runs_for_keeps_the_runs_planned_within_it(now):
    schedule = ScheduleFactory()
    old = finished_runs(schedule, now, [3 * DAY, 2 * DAY + HOUR])
    finished_runs(schedule, now, [2 * DAY - HOUR, HOUR])
    rules = prunable.Rules(keep_runs_for=2 * DAY)
    assert prunable_runs(now, rules) == ids(old)


def test_a_run_is_kept_when_either_the_count_or_the_age_keeps_it(now):
    schedule = ScheduleFactory()
    gone = finished_runs(schedule, now, [10 * DAY])
    finished_runs(schedule, now, [9 * DAY])  # old, but one of the last three
    finished_runs(schedule, now, [HOUR, 2 * HOUR])  # recent
    rules = prunable.Rules(keep_runs=3, keep_runs_for=DAY)
    assert prunable_runs(now, rules) == ids(gone)


def test_failed_runs_are_kept_for_keep_failed_runs_for(now):
    schedule = ScheduleFactory()
    succeeded = finished_runs(schedule, now, [3 * DAY])
    failed_kept = finished_runs(schedule, now, [3 * DAY + HOUR], status=Run.Status.FAILED)
    failed_gone = finished_runs(schedule, now, [8 * DAY], status=Run.Status.FAILED)
    rules = prunable.Rules(keep_runs_for=DAY, keep_failed_runs_for=7 * DAY)
    gone = prunable_runs(now, rules)
    assert gone == ids(succeeded + failed_gone)
    assert failed_kept[0].pk not in gone


@pytest.mark.parametrize("status", Run.ACTIVE_STATUSES)
def test_active_runs_are_never_deleted_nor_counted_as_kept(now, status):
    schedule = ScheduleFactory(overlap="concurrent")
    active = RunFactory(schedule=schedule, plan_time=now - 30 * DAY, status=status)
    LeaseFactory(run=active) if status == Run.Status.RUNNING else None
    newest = finished_runs(schedule, now, [40 * DAY])
    pruned = prune_all(now, prunable.Rules(keep_runs=1, keep_runs_for=timedelta(0)))
    assert pruned.runs == 0
    assert ids(Run.objects.all()) == ids([active, *newest])


def test_a_schedules_own_rules_override_the_settings(now):
    own = ScheduleFactory(keep_runs=3)
    ScheduleFactory(keep_runs_for=30 * DAY, keep_runs=None)
    default = ScheduleFactory()
    finished_runs(own, now, [4 * DAY, 3 * DAY, 2 * DAY])  # all kept: its last three
    gone = finished_runs(default, now, [4 * DAY, 3 * DAY])
    assert prunable_runs(now, prunable.Rules(keep_runs=1)) == ids(gone[:1])


def test_a_schedules_own_rule_prunes_without_any_setting(now):
    schedule = ScheduleFactory(keep_runs_for=DAY)
    gone = finished_runs(schedule, now, [2 * DAY])
    finished_runs(ScheduleFactory(), now, [2 * DAY])  # no rule: kept
    assert prunable_runs(now, prunable.Rules()) == ids(gone)


def test_schedules_kept_by_age_alone_each_apply_their_own_age_rules(now):
    longer = ScheduleFactory(keep_runs_for=5 * DAY)
    failed_longer = ScheduleFactory(keep_failed_runs_for=9 * DAY)
    counted = ScheduleFactory(keep_runs=1)  # a count rule: kept by it, not by age alone
    default = ScheduleFactory()
    gone = finished_runs(longer, now, [6 * DAY]) + finished_runs(default, now, [2 * DAY])
    finished_runs(longer, now, [4 * DAY])
    gone += finished_runs(failed_longer, now, [10 * DAY], status=Run.Status.FAILED)
    finished_runs(failed_longer, now, [8 * DAY], status=Run.Status.FAILED)
    gone += finished_runs(failed_longer, now, [8 * DAY + HOUR])  # not failed: KEEP_RUNS_FOR
    finished_runs(default, now, [3 * DAY], status=Run.Status.FAILED)  # KEEP_FAILED_RUNS_FOR
    gone += finished_runs(counted, now, [3 * DAY, 2 * DAY])
    finished_runs(counted, now, [HOUR])
    rules = prunable.Rules(keep_runs_for=DAY, keep_failed_runs_for=7 * DAY)
    assert prunable_runs(now, rules) == ids(gone)


def test_the_rules_come_from_the_settings(settings):
    settings.DJANGO_PERIODIC = {"KEEP_RUNS": 10, "KEEP_RUNS_FOR": 3600}
    assert prunable.Rules.from_settings() == prunable.Rules(10, HOUR, None)


def test_a_code_defined_schedule_takes_retention_options(clean_registry):
    def chatty():
        return None

    job(name="chatty", interval=timedelta(seconds=10), keep_runs=1000)(chatty)
    code_schedules.sync_code_schedules()
    assert Schedule.objects.get(name="chatty").keep_runs == 1000


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["keep_runs_for", "keep_failed_runs_for"])
def test_a_schedule_rejects_a_retention_duration_that_is_not_positive(field):
    schedule = ScheduleFactory.build(**{field: timedelta(0)})
    with pytest.raises(ValidationError) as raised:
        schedule.full_clean()
    assert field in raised.value.message_dict


def test_a_schedule_rejects_keeping_zero_runs():
    with pytest.raises(ValidationError) as raised:
        ScheduleFactory.build(keep_runs=0).full_clean()
    assert "keep_runs" in raised.value.message_dict


def test_the_admin_form_sets_and_validates_retention(admin_client):
    url = reverse("admin:django_periodic_schedule_add")
    response = admin_client.post(url, schedule_form_data(keep_runs_for="-1 00:00:00"))
    assert "keep_runs_for must be positive." in response.content.decode()
    response = admin_client.post(url, schedule_form_data(keep_runs="50", keep_runs_for="7 0:0:0"))
    assert response.status_code == 302
    saved = Schedule.objects.get(name="from-admin")
    assert (saved.keep_runs, saved.keep_runs_for) == (50, 7 * DAY)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"KEEP_RUNS": 0}, ["django_periodic.E003"]),
        ({"KEEP_RUNS_FOR": "1d"}, ["django_periodic.E003"]),
        ({"KEEP_FAILED_RUNS_FOR": -1}, ["django_periodic.E003"]),
        ({"PRUNE_INTERVAL": 0}, ["django_periodic.E003"]),
        ({"PRUNE_BATCH_SIZE": 0}, ["django_periodic.E003"]),
        ({"KEEP_RUNS": None, "KEEP_RUNS_FOR": None, "KEEP_FAILED_RUNS_FOR": None}, []),
    ],
)
def test_retention_settings_are_checked(settings, value, expected):
    settings.DJANGO_PERIODIC = value
    assert [error.id for error in checks.check_settings()] == expected


def test_keeping_failed_runs_longer_without_any_other_rule_is_warned_about(settings):
    settings.DJANGO_PERIODIC = {"KEEP_FAILED_RUNS_FOR": 3600}
    assert [w.id for w in checks.check_retention()] == ["django_periodic.W002"]
    settings.DJANGO_PERIODIC = {"KEEP_FAILED_RUNS_FOR": 3600, "KEEP_RUNS": 5}
    assert checks.check_retention() == []


# -- deleting ----------------------------------------------------------------------------------


def test_pruning_deletes_the_runs_and_their_leases(now):
    schedule = ScheduleFactory()
    old = finished_runs(schedule, now, [3 * DAY, 2 * DAY])
    for run in old:
        LeaseFactory(run=run, released_at=now)
    kept = finished_runs(schedule, now, [HOUR])
    pruned = prune_all(now, prunable.Rules(keep_runs_for=DAY))
    assert (pruned.runs, pruned.leases) == (2, 2)
    assert ids(Run.objects.all()) == ids(kept)
    assert not Lease.objects.exists()


def test_a_dry_run_counts_and_deletes_nothing(now):
    run = finished_runs(ScheduleFactory(), now, [3 * DAY])[0]
    LeaseFactory(run=run, released_at=now)
    pruned = prune_all(now, prunable.Rules(keep_runs_for=DAY), dry_run=True)
    assert (pruned.runs, pruned.leases) == (1, 1)
    assert Run.objects.count() == Lease.objects.count() == 1


def test_every_batch_of_runs_costs_the_same_three_statements(now):
    for _ in range(2):
        finished_runs(ScheduleFactory(), now, [4 * DAY, 3 * DAY, 2 * DAY, DAY])
    with CaptureQueriesContext(connection) as captured:
        pruned = prune_all(now, prunable.Rules(keep_runs=1), batch_size=4)
    app = [q["sql"] for q in captured.captured_queries if "django_periodic_" in q["sql"]]
    # The schedules and their N-th newest runs, then batches of 4 and 2 runs: select ids,
    # delete their leases, delete them. (Versions are trimmed as they are written.)
    assert pruned.runs == 6
    assert len(app) == 2 + 2 * 3


def bulk_schedules(count: int) -> None:
    """``count`` schedules more, created as a bulk import would (no save(), no version)."""
    start = Schedule.objects.count()
    Schedule.objects.bulk_create(
        Schedule(name=f"bulk-{start + i}", job="tests.jobs.noop", interval=HOUR)
        for i in range(count)
    )


@pytest.mark.parametrize(
    "configured",
    [
        {},
        {"KEEP_VERSIONS": None},
        {"KEEP_RUNS_FOR": 30 * DAY, "KEEP_FAILED_RUNS_FOR": 60 * DAY},
        {"KEEP_RUNS": 10, "KEEP_RUNS_FOR": 30 * DAY},
    ],
)
def test_an_idle_pass_costs_the_same_statements_whatever_the_number_of_schedules(
    settings, configured
):
    settings.DJANGO_PERIODIC = configured

    def statements_of_a_pass() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            pruned = pruner.Pruner("default").prune_once()
        assert pruned == retention.Pruned()
        return [q["sql"] for q in captured.captured_queries]

    bulk_schedules(10)
    few = statements_of_a_pass()
    bulk_schedules(990)
    assert len(statements_of_a_pass()) == len(few)
    # One transaction (a savepoint in the test's): the mark (the oldest active run, the
    # newest), the schedules' distinct own rules, and with a rule one statement more:
    # whether a run goes by age alone, or with a count rule the walk of this Pruner's first
    # pass (one statement for the schedules that follow the settings); on PostgreSQL also
    # the clock. Nothing to delete: no lock is taken.
    ruled = 1 if configured.get("KEEP_RUNS_FOR") or configured.get("KEEP_RUNS") else 0
    clock = 1 if connection.vendor == "postgresql" else 0
    assert few[0].startswith("SAVEPOINT") and few[-1].startswith("RELEASE SAVEPOINT")
    assert len(few) == 2 + 3 + ruled + clock


def test_schedules_are_read_a_batch_at_a_time(now, monkeypatch):
    monkeypatch.setattr(prunable, "SCHEDULE_BATCH", 2)
    schedules = [ScheduleFactory() for _ in range(5)]
    for schedule in schedules:
        finished_runs(schedule, now, [2 * DAY, HOUR])
    pruned = prune_all(now, prunable.Rules(keep_runs_for=DAY))
    assert pruned.runs == 5
    assert Run.objects.count() == 5


def test_a_prune_stops_between_batches_when_asked(now):
    finished_runs(ScheduleFactory(), now, [4 * DAY, 3 * DAY, 2 * DAY])
    batches = list(
        retention.prune(now, rules=prunable.Rules(keep_runs=1), batch_size=1, stopping=lambda: True)
    )
    assert [batch.runs for batch in batches] == [1]
    assert Run.objects.count() == 2


# -- a later pass: the changes since a mark --------------------------------------------------


def prune_since(now, since, rules) -> retention.Pruned:
    """A prune that reads the schedules with a count rule whose runs changed since ``since``."""
    return prune_all(now, rules, since=since)


def test_the_schedules_with_a_run_finished_since_the_mark_are_pruned(now):
    rules = prunable.Rules(keep_runs=1)
    changed, unchanged = ScheduleFactory(), ScheduleFactory()
    finished_runs(changed, now, [3 * HOUR])
    finished_runs(unchanged, now, [3 * HOUR])
    since = prunable.mark(now, "default")
    gone = finished_runs(changed, now, [2 * HOUR])[0]
    finished_runs(changed, now, [HOUR])
    assert prunable_runs(now, rules) == ids([gone, *changed.runs.filter(plan_time=now - 3 * HOUR)])
    assert prune_since(now, since, rules).runs == 2
    assert ids(Run.objects.all()) == ids([*unchanged.runs.all(), *changed.runs.all()])
    assert changed.runs.get().plan_time == now - HOUR


def test_a_run_active_at_the_mark_counts_once_it_finishes(now):
    rules = prunable.Rules(keep_runs=1)
    schedule = ScheduleFactory(overlap="concurrent")
    old = finished_runs(schedule, now, [3 * HOUR])
    running = RunFactory(schedule=schedule, plan_time=now - HOUR, status=Run.Status.RUNNING)
    since = prunable.mark(now, "default")
    assert since.runs_from == running.pk
    Run.objects.filter(pk=running.pk).update(status=Run.Status.SUCCEEDED, finished_at=now)
    assert prune_since(now, since, rules).runs == 1
    assert not Run.objects.filter(pk=old[0].pk).exists()


def test_without_a_change_since_the_mark_no_schedule_is_read_and_nothing_goes(now):
    schedule = ScheduleFactory(keep_runs=3)
    finished_runs(schedule, now, [3 * HOUR, 2 * HOUR, HOUR])
    since = prunable.mark(now, "default")
    # A rule lowered without a new run: applied at the schedule's next finished run, or by
    # a walk (prune_runs, a scheduler's first pass).
    Schedule.objects.filter(pk=schedule.pk).update(keep_runs=1)
    with CaptureQueriesContext(connection) as captured:
        assert prune_since(now, since, prunable.Rules()).runs == 0
    # Its own rules, then the runs changed since the mark: none, so no schedule is read
    # (on PostgreSQL the pruning lock too, taken and freed).
    read = [q["sql"] for q in captured.captured_queries if "django_periodic_" in q["sql"]]
    assert len(read) == 2
    assert prune_all(now, prunable.Rules()).runs == 2


def test_a_run_that_passed_its_age_rule_since_the_mark_goes_without_a_new_run(now):
    # Beyond the last one, but kept by age: it goes once it is older than a day.
    rules = prunable.Rules(keep_runs=1, keep_runs_for=DAY)
    schedule = ScheduleFactory()
    aging = finished_runs(schedule, now, [20 * HOUR])[0]
    finished_runs(schedule, now, [10 * HOUR])
    since = prunable.mark(now, "default")
    assert prune_since(now + 2 * HOUR, since, rules).runs == 0  # 22 hours old: kept
    assert prune_since(now + 6 * HOUR, since, rules).runs == 1
    assert not Run.objects.filter(pk=aging.pk).exists()


def test_a_failed_run_that_passed_keep_failed_runs_for_since_the_mark_goes(now):
    rules = prunable.Rules(keep_runs=1, keep_failed_runs_for=DAY)
    schedule = ScheduleFactory()
    failed = finished_runs(schedule, now, [20 * HOUR], status=Run.Status.FAILED)[0]
    finished_runs(schedule, now, [10 * HOUR])
    since = prunable.mark(now, "default")
    assert prune_since(now + 2 * HOUR, since, rules).runs == 0
    assert prune_since(now + 6 * HOUR, since, rules).runs == 1
    assert not Run.objects.filter(pk=failed.pk).exists()


def test_the_pruner_walks_at_its_first_pass_then_reads_the_changes_since(settings, now):
    settings.DJANGO_PERIODIC = {"KEEP_RUNS": 1}
    schedule = ScheduleFactory()
    finished_runs(schedule, now, [3 * HOUR, 2 * HOUR])
    process = pruner.Pruner("default")
    process.look_at_start()
    assert process.prune_once().runs == 1  # the walk
    finished_runs(schedule, now, [HOUR])
    assert process.prune_once().runs == 1  # a run finished since the look at start
    assert list(Run.objects.values_list("plan_time", flat=True)) == [now - HOUR]


# -- never firing again ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trigger",
    [
        {"interval": timedelta(seconds=10)},
        {"cron": "* * * * *", "interval": None},
    ],
)
def test_pruning_all_history_never_fires_an_old_plan_time_again(now, trigger):
    start = now - HOUR
    schedule = ScheduleFactory(**trigger, start_at=start, overlap="concurrent", misfire="all")
    set_cursor(schedule, start)
    moment = start + timedelta(minutes=3, seconds=5)
    assert planner.plan_due(moment).fired >= 4
    old_times = sorted(Run.objects.values_list("plan_time", flat=True))
    for run in Run.objects.all():
        LeaseFactory(run=run, released_at=moment)
    Run.objects.update(status=Run.Status.SUCCEEDED, finished_at=moment)

    prune_all(moment, prunable.Rules(keep_runs_for=timedelta(0)))
    assert not Run.objects.exists() and not Lease.objects.exists()

    for at in [*old_times, moment]:
        assert planner.plan_due(at).fired == 0
    next_fire = Schedule.objects.get(pk=schedule.pk).next_fire_at
    assert next_fire > old_times[-1]
    planner.plan_due(next_fire)
    assert list(Run.objects.values_list("plan_time", flat=True)) == [next_fire]


def test_pruning_a_fired_one_shots_history_never_fires_it_again(now):
    schedule = ScheduleFactory(interval=None, run_at=now - HOUR, misfire="all")
    planner.plan_due(now)
    Run.objects.update(status=Run.Status.SUCCEEDED, finished_at=now)
    prune_all(now, prunable.Rules(keep_runs_for=timedelta(0)))
    assert not Run.objects.exists()
    assert planner.plan_due(now + DAY).fired == 0
    assert Schedule.objects.get(pk=schedule.pk).next_fire_at is None


# -- one pruner at a time (PostgreSQL) ---------------------------------------------------------


def test_a_second_prune_finds_the_first_under_way_and_does_nothing(postgres, now):
    finished_runs(ScheduleFactory(), now, [2 * DAY])
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(pg.LOCK_SQL, [pg.LOCK_NAMESPACE, pg.PRUNING])
        pruned = prune_all(now, prunable.Rules(keep_runs_for=DAY))
        assert pruned.busy and pruned.runs == 0
        assert Run.objects.count() == 1
        with other.cursor() as cursor:
            cursor.execute(pg.UNLOCK_SQL, [pg.LOCK_NAMESPACE, pg.PRUNING])
    finally:
        other.close()
    assert prune_all(now, prunable.Rules(keep_runs_for=DAY)).runs == 1


def test_the_pruning_lock_is_in_the_one_key_scheme_and_never_a_process_presence(postgres):
    # A process's presence keeps the key that earlier releases hold, (0x4450, id mod 2**31),
    # so old and new processes see each other's locks in a rolling deploy; pruning's key is
    # negative, which no process's reaches (LOST_SQL compares objid to mod(id, 2**31)).
    assert (pg.LOCK_NAMESPACE, pg.process_key(7), pg.process_key(2**31 + 7)) == (0x4450, 7, 7)
    with pg.one_at_a_time(connection, pg.PRUNING, wait=False) as got:
        assert got
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT classid::int, objid::bigint, objsubid FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
            ((classid, objid, objsubid),) = cursor.fetchall()
    assert (classid, objsubid) == (pg.LOCK_NAMESPACE, pg.TWO_KEYS)
    assert objid >= 2**31  # never mod(id, 2**31) of a process


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_prunes_delete_every_old_run_once(postgres, now):
    schedules = [ScheduleFactory() for _ in range(4)]
    for schedule in schedules:
        old = finished_runs(schedule, now, [timedelta(minutes=m + 1) + DAY for m in range(30)])
        for run in old[::3]:
            LeaseFactory(run=run, released_at=now)
        finished_runs(schedule, now, [HOUR])
    results: list[retention.Pruned] = []
    start = threading.Barrier(2)

    def prune_in_thread():
        try:
            start.wait()
            rules = prunable.Rules(keep_runs_for=DAY)
            results.append(prune_all(now, rules, batch_size=7, wait=True))
        finally:
            connections.close_all()

    threads = [Thread(target=prune_in_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(r.runs for r in results) == 4 * 30
    assert sum(r.leases for r in results) == 4 * 10
    assert Run.objects.count() == 4
    assert not Lease.objects.exists()


# -- run_scheduler's pass ----------------------------------------------------------------------


def test_the_pruner_thread_applies_the_settings(settings, now):
    settings.DJANGO_PERIODIC = {"KEEP_RUNS": 1}
    schedule = ScheduleFactory()
    finished_runs(schedule, now, [2 * HOUR, HOUR])
    assert pruner.Pruner("default").prune_once().runs == 1
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("interval", "kept"), [(timedelta(seconds=60), True), (HOUR, False)])
def test_the_pruner_keeps_its_connection_between_passes_as_close_as_wake_ups(
    settings, interval, kept
):
    # IDLE_INTERVAL is 120 s: the loop keeps its connection between wake-ups that far apart.
    settings.DJANGO_PERIODIC = {"PRUNE_INTERVAL": interval}
    process = pruner.Pruner("default")
    process._step(process.prune_once)
    assert (connection.connection is not None) is kept


@pytest.mark.django_db(transaction=True)
def test_run_scheduler_prunes_history_in_the_background(postgres, children, now):
    schedule = ScheduleFactory(keep_runs=2, enabled=False)
    finished_runs(schedule, now, [4 * DAY, 3 * DAY, 2 * DAY, DAY])
    child = children.start("--workers", "1", settings={"PRUNE_INTERVAL": 0.2})
    wait_for(lambda: Run.objects.count() == 2, 30, "the scheduler to prune two runs")
    kept = Run.objects.order_by("plan_time").values_list("plan_time", flat=True)
    assert list(kept) == [now - 2 * DAY, now - DAY]
    assert child.terminate() == 0
