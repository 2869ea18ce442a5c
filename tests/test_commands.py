from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_periodic.db import clock
from django_periodic.models import Run, Schedule, SchedulerProcess
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import output_of


@pytest.mark.django_db
def test_periodic_status_shows_schedulers_failures_and_broken_schedules(now):
    SchedulerProcess.objects.create(host="alive", pid=1, started_at=now, heartbeat_at=now)
    old = now - SchedulerProcess.stale_after() - timedelta(seconds=1)
    SchedulerProcess.objects.create(host="dead", pid=2, started_at=old, heartbeat_at=old)
    RunFactory(status="failed", error_code="ValueError", finished_at=now)
    broken = ScheduleFactory(name="broken")
    Schedule.objects.filter(pk=broken.pk).update(
        enabled=False, last_error="Cannot plan: bad", planning_failures=3
    )
    out = StringIO()
    with pytest.raises(CommandError, match=r"1 schedule\(s\) disabled by errors"):
        call_command("periodic_status", stdout=out)
    text = out.getvalue()  # the whole report comes before the verdict
    assert "alive:1  alive" in text
    assert "dead:2  STALE" in text
    assert "ValueError" in text
    assert "broken  DISABLED  3 failed ticks  Cannot plan: bad" in text


@pytest.mark.django_db
def test_prune_runs_deletes_only_old_finished_runs():
    now = clock.now()
    old_done = RunFactory(plan_time=now - timedelta(days=40), status="succeeded")
    old_active = RunFactory(plan_time=now - timedelta(days=40), status="retrying")
    recent = RunFactory(plan_time=now - timedelta(days=1), status="failed")
    output_of("prune_runs", days=30)
    assert set(Run.objects.values_list("pk", flat=True)) == {old_active.pk, recent.pk}
    assert not Run.objects.filter(pk=old_done.pk).exists()


@pytest.mark.django_db
def test_prune_runs_rejects_negative_days():
    with pytest.raises(CommandError, match="negative"):
        call_command("prune_runs", days=-1)


def test_run_scheduler_needs_a_worker_unless_planning_only():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("run_scheduler", workers=0)
