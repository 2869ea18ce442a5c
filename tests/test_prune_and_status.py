"""prune_runs (batched, counted, dry-run) and periodic_status's verdict (OK or exit status 1)."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import signals
from django.test.utils import CaptureQueriesContext

from django_periodic.conf import get_settings
from django_periodic.engine.planning import planner
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import output_of, overdue_schedule, set_cursor

OLD = timedelta(days=40)


def lease_for(run: Run, attempt: int, expires_at) -> Lease:
    """A lease row for one attempt of ``run``, never released."""
    return Lease.objects.create(
        run=run,
        attempt=attempt,
        holder="test:1",
        acquired_at=expires_at - timedelta(seconds=30),
        heartbeat_at=expires_at - timedelta(seconds=30),
        expires_at=expires_at,
    )


def old_finished_runs(now, n: int, leases_each: int = 1) -> list[Run]:
    """``n`` succeeded runs of one schedule, planned 40 days ago, with their leases."""
    schedule = ScheduleFactory()
    runs = [
        RunFactory(
            schedule=schedule, plan_time=now - OLD + timedelta(minutes=i), status="succeeded"
        )
        for i in range(n)
    ]
    for run in runs:
        for attempt in range(1, leases_each + 1):
            lease_for(run, attempt, now - OLD)
    return runs


def statements(captured: CaptureQueriesContext) -> list[str]:
    """The SQL run on the app's tables (not the clock, nor the test's own savepoints)."""
    return [
        query["sql"] for query in captured.captured_queries if "django_periodic_" in query["sql"]
    ]


# -- prune_runs ---------------------------------------------------------------------------


def test_prune_runs_counts_runs_and_leases_separately(now):
    old_finished_runs(now, 2, leases_each=2)
    text = output_of("prune_runs", days=30)
    assert "Deleted 2 runs and 4 leases; kept runs planned since" in text
    assert not Run.objects.exists()
    assert not Lease.objects.exists()


def test_prune_runs_never_loads_full_run_rows(now):
    old_finished_runs(now, 3)
    with CaptureQueriesContext(connection) as captured:
        call_command("prune_runs", days=30, stdout=StringIO())
    selects = [sql for sql in statements(captured) if sql.upper().startswith("SELECT")]
    assert selects, "the ids of the runs are selected"
    assert not [sql for sql in selects if "job_name" in sql or "traceback" in sql]


def test_prune_runs_costs_the_same_statements_for_every_batch(now):
    old_finished_runs(now, 5)
    with CaptureQueriesContext(connection) as captured:
        text = output_of("prune_runs", days=30, batch_size=2)
    # The schedules' distinct own rules, then three batches (2, 2, 1) of: select ids,
    # delete leases by run id, delete runs by id (no count rule: no schedule is walked);
    # then the schedules' versions' cutoffs (none to delete), and the limits' older versions,
    # all limits in one statement.
    assert len(statements(captured)) == 1 + 3 * 3 + 1 + 1
    assert "Deleted 5 runs and 5 leases" in text
    assert not Run.objects.exists()


def test_prune_runs_dry_run_counts_and_deletes_nothing(now):
    old_finished_runs(now, 3, leases_each=2)
    text = output_of("prune_runs", days=30, dry_run=True)
    assert "Would delete 3 runs and 6 leases; kept runs planned since" in text
    assert Run.objects.count() == 3
    assert Lease.objects.count() == 6


@pytest.mark.parametrize("status", Run.ACTIVE_STATUSES)
def test_prune_runs_keeps_active_runs_and_their_leases(now, status):
    active = RunFactory(plan_time=now - OLD, status=status)
    lease_for(active, 1, now - OLD)
    text = output_of("prune_runs", days=0)
    assert "Deleted 0 runs and 0 leases" in text
    assert Run.objects.get() == active
    assert Lease.objects.filter(run=active).exists()


def test_prune_runs_keeps_recent_finished_runs(now):
    recent = RunFactory(plan_time=now - timedelta(days=1), status="failed")
    old_finished_runs(now, 1)
    output_of("prune_runs", days=30)
    assert Run.objects.get() == recent


def test_prune_runs_without_options_applies_the_retention_settings(now, settings):
    settings.DJANGO_PERIODIC = {"KEEP_RUNS": 1}
    runs = old_finished_runs(now, 3)
    text = output_of("prune_runs")
    assert "Deleted 2 runs and 2 leases; kept the last 1 finished runs of each schedule" in text
    assert list(Run.objects.all()) == [runs[-1]]


def test_prune_runs_keep_runs_keeps_the_last_runs_of_each_schedule(now):
    runs = old_finished_runs(now, 3)
    output_of("prune_runs", keep_runs=2)
    assert sorted(Run.objects.values_list("pk", flat=True)) == [runs[1].pk, runs[2].pk]


def test_prune_runs_without_any_rule_keeps_thirty_days(now):
    recent = RunFactory(plan_time=now - timedelta(days=29), status="succeeded")
    old_finished_runs(now, 1)  # 40 days old
    assert "kept runs planned since" in output_of("prune_runs")
    assert Run.objects.get() == recent


def test_prune_runs_keeps_what_a_schedules_own_rule_keeps(now):
    runs = old_finished_runs(now, 2)
    Schedule.objects.filter(pk=runs[0].schedule_id).update(keep_runs=5)
    output_of("prune_runs", days=30)
    assert Run.objects.count() == 2


def test_prune_runs_rejects_keeping_fewer_than_one_run(db):
    with pytest.raises(CommandError, match="at least 1"):
        call_command("prune_runs", keep_runs=0)


def test_prune_runs_rejects_a_batch_size_below_one(db):
    with pytest.raises(CommandError, match="at least 1"):
        call_command("prune_runs", batch_size=0)


def test_prune_runs_sends_delete_signals_when_the_project_listens(now):
    old_finished_runs(now, 2)
    deleted = []

    def receiver(sender, instance, **kwargs):
        deleted.append(instance.pk)

    signals.post_delete.connect(receiver, sender=Run)
    try:
        text = output_of("prune_runs", days=30)
    finally:
        signals.post_delete.disconnect(receiver, sender=Run)
    assert len(deleted) == 2
    assert "Deleted 2 runs and 2 leases" in text


def test_pruning_all_history_does_not_fire_old_plan_times_again(now):
    every = timedelta(seconds=10)
    start = now - timedelta(hours=1)
    schedule = ScheduleFactory(interval=every, start_at=start, overlap="concurrent")
    set_cursor(schedule, start)
    moment = start + timedelta(seconds=35)
    assert planner.plan_due(moment).fired == 4
    Run.objects.update(status="succeeded")
    output_of("prune_runs", days=0)
    assert not Run.objects.exists()
    assert planner.plan_due(moment).fired == 0
    planner.plan_due(moment + every)
    assert list(Run.objects.values_list("plan_time", flat=True)) == [start + 4 * every]


# -- periodic_status ------------------------------------------------------------------------


def test_periodic_status_says_ok_for_a_healthy_setup(now, process):
    overdue_schedule(now)  # due, but a live scheduler will plan it
    running = RunFactory(status="running", attempt=1)
    lease_for(running, 1, now - timedelta(seconds=1))  # expired, the next sweep is not late yet
    text = output_of("periodic_status")
    assert text.rstrip().endswith("OK")


def test_periodic_status_fails_when_no_scheduler_is_alive_and_schedules_are_overdue(now):
    overdue_schedule(now)
    dead = now - SchedulerProcess.stale_after() - timedelta(seconds=1)
    SchedulerProcess.objects.create(host="dead", pid=2, started_at=dead, heartbeat_at=dead)
    with pytest.raises(CommandError, match="no live scheduler process, and 1 schedule"):
        output_of("periodic_status")


def test_periodic_status_fails_on_expired_leases_left_unswept(now, process):
    running = RunFactory(status="running", attempt=1)
    lease_for(running, 1, now - get_settings().SWEEP_INTERVAL - timedelta(seconds=1))
    with pytest.raises(CommandError, match=r"1 lease\(s\) expired over 10 s ago and not swept"):
        output_of("periodic_status")


def test_periodic_status_fails_on_schedules_disabled_by_errors(now, process):
    broken = ScheduleFactory(name="broken")
    Schedule.objects.filter(pk=broken.pk).update(enabled=False, last_error="Cannot plan: bad")
    ScheduleFactory(name="paused", enabled=False)  # paused by hand: nothing to look at
    with pytest.raises(CommandError, match=r"1 schedule\(s\) disabled by errors"):
        output_of("periodic_status")


def test_periodic_status_lists_every_problem_and_still_prints_the_report(now):
    overdue_schedule(now)
    broken = ScheduleFactory(name="broken")
    Schedule.objects.filter(pk=broken.pk).update(enabled=False, last_error="Cannot plan: bad")
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("periodic_status", stdout=out)
    assert "no live scheduler" in str(raised.value)
    assert "disabled by errors" in str(raised.value)
    assert "broken  DISABLED" in out.getvalue()


def test_periodic_status_exits_with_status_1_when_something_needs_attention(now):
    overdue_schedule(now)
    with pytest.raises(CommandError) as raised:
        output_of("periodic_status")
    assert raised.value.returncode == 1


def test_periodic_status_counts_failures_by_scope(now, process):
    schedule = ScheduleFactory(name="billing", job="tests.jobs.per_tenant",
                               scopes="tests.jobs.tenants")  # fmt: skip
    for k, (scope, status) in enumerate(
        [("acme", "failed"), ("acme", "failed"), ("globex", "failed"), ("initech", "succeeded")]
    ):
        RunFactory(schedule=schedule, scope=scope, status=status, finished_at=now,
                   plan_time=now - timedelta(minutes=k))  # fmt: skip
    text = output_of("periodic_status")
    section = text[text.index("Failures by scope") :]
    assert section.index("billing [acme]  2 failed") < section.index("billing [globex]  1 failed")
    assert "initech" not in section
