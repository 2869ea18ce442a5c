from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count

from django_periodic import clock
from django_periodic.conf import get_settings
from django_periodic.models import Lease, Run, RunQuerySet, Schedule, SchedulerProcess

# The scopes with the most failed runs that the report lists one by one.
FAILING_SCOPES = 20


class Command(BaseCommand):
    help = (
        "Show what is due, running, stale and failing, and which schedulers are alive. "
        "Ends with OK, or fails with exit status 1 naming what needs attention."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, database: str, **options: Any) -> None:
        now = clock.now(database)
        stale_after = SchedulerProcess.stale_after()
        schedules = Schedule.objects.using(database)
        runs = Run.objects.using(database)
        self._section("Schedulers")
        for process in SchedulerProcess.objects.using(database):
            age = (now - process.heartbeat_at).total_seconds()
            state = "STALE" if now - process.heartbeat_at > stale_after else "alive"
            self._line(f"{process}  {state}  last heartbeat {age:.0f} s ago")
        self._section("Runs by status")
        for row in runs.values("status").annotate(n=Count("pk")).order_by("status"):
            self._line(f"{row['status']:<10} {row['n']}")
        self._section("Due now")
        for schedule in schedules.due(now)[:20]:
            self._line(f"{schedule.name}  due since {schedule.next_fire_at:%Y-%m-%d %H:%M:%S}")
        self._section("Stale leases (holder stopped heartbeating)")
        for lease in Lease.objects.using(database).expired(now).select_related("run")[:20]:
            self._line(f"run {lease.run_id} ({lease.run.job_name}) held by {lease.holder}")
        self._section("Schedules with errors")
        for schedule in schedules.exclude(last_error=""):
            state = "enabled" if schedule.enabled else "DISABLED"
            failures = f"{schedule.planning_failures} failed ticks"
            self._line(f"{schedule.name}  {state}  {failures}  {schedule.last_error}")
        self._section("Recent failures")
        for run in runs.failed().order_by("-finished_at")[:10]:
            scope = f" [{run.scope}]" if run.scope else ""
            self._line(
                f"{run.job_name}{scope} @ {run.plan_time:%Y-%m-%d %H:%M:%S}  {run.error_code}"
            )
        self._failures_by_scope(runs)
        self._verdict(_problems(now, database))

    def _failures_by_scope(self, runs: RunQuerySet) -> None:
        """Failed runs of fanned-out schedules counted by (schedule, scope), most first:
        the tenants (accounts, ...) whose runs keep failing."""
        by_scope = (
            runs.failed()
            .exclude(scope="")
            .values("schedule__name", "scope")
            .annotate(n=Count("pk"))
            .order_by("-n", "schedule__name", "scope")
        )
        listed = list(by_scope[: FAILING_SCOPES + 1])
        if not listed:
            return
        self._section("Failures by scope")
        for row in listed[:FAILING_SCOPES]:
            self._line(f"{row['schedule__name']} [{row['scope']}]  {row['n']} failed")
        if len(listed) > FAILING_SCOPES:
            self._line(f"... and {by_scope.count() - FAILING_SCOPES} more scopes with failures")

    def _verdict(self, found: list[str]) -> None:
        """End with OK, or fail (exit status 1) so that cron and monitoring notice."""
        if found:
            raise CommandError("Needs attention: " + "; ".join(found) + ".")
        self.stdout.write(self.style.SUCCESS("OK"))

    def _section(self, title: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(title))

    def _line(self, text: str) -> None:
        self.stdout.write(f"  {text}")


def _problems(now: datetime, using: str = "default") -> list[str]:
    """What an operator must look at: the signs of a broken setup, one sentence each.

    Each allows the slack a healthy setup needs (a heartbeat or a sweep a little late),
    so that a live scheduler between two ticks is not reported.
    """
    stale_after = SchedulerProcess.stale_after()
    sweep_interval = get_settings().SWEEP_INTERVAL
    schedules = Schedule.objects.using(using)
    found = []
    overdue = schedules.due(now - stale_after).count()
    processes = SchedulerProcess.objects.using(using)
    alive = processes.exclude(pk__in=processes.stale(now).values("pk"))
    if overdue and not alive.exists():
        found.append(
            f"no live scheduler process, and {overdue} schedule(s) due for over "
            f"{_seconds(stale_after)}"
        )
    unswept = Lease.objects.using(using).expired(now - sweep_interval).count()
    if unswept:
        found.append(
            f"{unswept} lease(s) expired over {_seconds(sweep_interval)} ago and not swept"
        )
    disabled = schedules.filter(enabled=False).exclude(last_error="").count()
    if disabled:
        found.append(f"{disabled} schedule(s) disabled by errors")
    return found


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():.0f} s"
