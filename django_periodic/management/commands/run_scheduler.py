import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_periodic import stop_signals
from django_periodic.conf import get_settings
from django_periodic.scheduler import Scheduler

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

logger = logging.getLogger("django_periodic")


class Command(BaseCommand):
    help = (
        "Plan due schedules and execute their runs until SIGTERM or SIGINT "
        "(a second one stops waiting for running jobs)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="Threads executing runs (default: DJANGO_PERIODIC['WORKERS']).",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Plan and run what is due now, wait for those runs, then exit.",
        )
        parser.add_argument(
            "--plan-only", action="store_true", help="Only plan runs; execute none."
        )
        parser.add_argument("--database", default="default", help="Database alias to use.")

    def handle(
        self,
        *args: Any,
        workers: int | None,
        once: bool,
        plan_only: bool,
        database: str,
        verbosity: int,
        **options: Any,
    ) -> None:
        self._configure_logging(verbosity)
        workers = get_settings().WORKERS if workers is None else workers
        if workers < 1 and not plan_only:
            raise CommandError("--workers must be at least 1 (or use --plan-only).")
        signals = stop_signals.for_process()
        try:
            if signals.requested:
                logger.info("Stop requested while starting; exiting before any work.")
                return
            scheduler = Scheduler(workers=0 if plan_only else workers, using=database, stop=signals)
            scheduler.run(once=once)
        finally:
            stop_signals.release_process()

    def _configure_logging(self, verbosity: int) -> None:
        logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
