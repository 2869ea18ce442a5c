from django.core.management.base import BaseCommand
from django.db.models import Count

from django_periodic import clock
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess


class Command(BaseCommand):
    help = "Show what is due, running, stale and failing, and which schedulers are alive."

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default")

    def handle(self, *args, database, **options):
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
            self._line(f"{run.job_name} @ {run.plan_time:%Y-%m-%d %H:%M:%S}  {run.error_code}")

    def _section(self, title: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(title))

    def _line(self, text: str) -> None:
        self.stdout.write(f"  {text}")
