from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_periodic.conf import RANGES, get_settings
from django_periodic.db import clock
from django_periodic.management import check_range
from django_periodic.operations import retention
from django_periodic.operations.prunable import Rules
from django_periodic.timing import bounds

DEFAULT_BATCH_SIZE = 5000
# What is kept when neither the options nor the settings say (the command's old default).
DEFAULT_DAYS = 30
# The options' ranges, those of the settings they replace; --days in whole days, and 0
# keeps no run for its age.
DAYS = bounds.Range(0, RANGES["KEEP_RUNS_FOR"].high.days)
KEEP_RUNS = RANGES["KEEP_RUNS"]
BATCH_SIZE = RANGES["PRUNE_BATCH_SIZE"]


class Command(BaseCommand):
    help = (
        "Delete the finished runs (and their leases) that the retention rules do not keep, "
        "in batches: the KEEP_* settings and each schedule's own, as run_scheduler applies "
        "them; --days and --keep-runs replace the settings. With no rule at all, runs "
        f"planned more than {DEFAULT_DAYS} days ago go. Active runs are kept, and schedule "
        "cursors keep old plan times from firing again. Versions past each schedule's "
        "newest KEEP_VERSIONS go too (each save trims its schedule's: this catches up after "
        "KEEP_VERSIONS is lowered)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            help="Keep runs planned within this many days (instead of KEEP_RUNS_FOR).",
        )
        parser.add_argument(
            "--keep-runs",
            type=int,
            help="Keep the last N finished runs of each schedule (instead of KEEP_RUNS).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Runs deleted per transaction ({DEFAULT_BATCH_SIZE}; at most 999 on SQLite).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument("--database", default="default", help="Database alias to use.")

    def handle(
        self,
        *args: Any,
        days: int | None,
        keep_runs: int | None,
        batch_size: int,
        dry_run: bool,
        database: str,
        verbosity: int,
        **options: Any,
    ) -> None:
        check_range("--days", days, DAYS)
        check_range("--keep-runs", keep_runs, KEEP_RUNS)
        check_range("--batch-size", batch_size, BATCH_SIZE)
        rules = _rules(days, keep_runs)
        now = clock.now(database)
        pruned = retention.Pruned()
        batches = retention.prune(
            now,
            using=database,
            rules=rules,
            batch_size=batch_size,
            dry_run=dry_run,
            wait=True,
            versions=True,
        )
        for batch in batches:
            pruned += batch
            if verbosity >= 2 and not dry_run:
                self.stdout.write(f"  {pruned.runs} runs and {pruned.leases} leases deleted so far")
        verb = "Would delete" if dry_run else "Deleted"
        self.stdout.write(
            f"{verb} {pruned.runs} runs and {pruned.leases} leases; {_kept(rules, now)}."
        )
        if (keep_versions := get_settings().KEEP_VERSIONS) is not None:
            self.stdout.write(
                f"{verb} {pruned.versions} versions; kept the newest {keep_versions} of each "
                "schedule and limit (KEEP_VERSIONS)."
            )


def _rules(days: int | None, keep_runs: int | None) -> Rules:
    rules = Rules.from_settings()
    if days is not None:
        rules = Rules(rules.keep_runs, timedelta(days=days), rules.keep_failed_runs_for)
    if keep_runs is not None:
        rules = Rules(keep_runs, rules.keep_runs_for, rules.keep_failed_runs_for)
    if not rules.limited:
        rules = Rules(None, timedelta(days=DEFAULT_DAYS), rules.keep_failed_runs_for)
    return rules


def _kept(rules: Rules, now: datetime) -> str:
    kept = []
    if rules.keep_runs is not None:
        kept.append(f"the last {rules.keep_runs} finished runs of each schedule")
    if rules.keep_runs_for is not None:
        kept.append(f"runs planned since {now - rules.keep_runs_for:%Y-%m-%d %H:%M}")
    if rules.keep_failed_runs_for is not None:
        kept.append(f"failed runs planned since {now - rules.keep_failed_runs_for:%Y-%m-%d %H:%M}")
    return "kept " + ", ".join(kept) + " (or as each schedule's own rules say)"
