from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_periodic import clock
from django_periodic.models import Run


class Command(BaseCommand):
    help = "Delete finished runs (and their leases) older than --days. Cursors keep exactly-once."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=30, help="Keep this many days (30).")
        parser.add_argument("--database", default="default")

    def handle(self, *args, days, database, **options):
        if days < 0:
            raise CommandError("--days must not be negative.")
        cutoff = clock.now(database) - timedelta(days=days)
        finished = Run.objects.using(database).exclude(status__in=Run.ACTIVE_STATUSES)
        deleted, _ = finished.filter(plan_time__lt=cutoff).delete()
        self.stdout.write(f"Deleted {deleted} rows of runs planned before {cutoff:%Y-%m-%d %H:%M}.")
