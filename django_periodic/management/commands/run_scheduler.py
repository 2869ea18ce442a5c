import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_periodic.conf import RANGES, get_settings
from django_periodic.engine.loop import stop_signals
from django_periodic.engine.loop.scheduler import Scheduler
from django_periodic.management import PORTS, check_range
from django_periodic.operations import pruner, runlog

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
# The run log (a line per run transition, at INFO) from --verbosity 2 on.
RUN_LOG_LEVELS = {0: logging.WARNING, 1: logging.WARNING, 2: logging.INFO, 3: logging.INFO}

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
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="Serve Prometheus metrics on this port (needs prometheus-client).",
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            help="Address the metrics are served on (default: 127.0.0.1, loopback only).",
        )

    def handle(
        self,
        *args: Any,
        workers: int | None,
        once: bool,
        plan_only: bool,
        database: str,
        verbosity: int,
        metrics_port: int | None,
        metrics_host: str,
        **options: Any,
    ) -> None:
        workers = 0 if plan_only else _workers(workers)
        check_range("--metrics-port", metrics_port, PORTS)
        self._configure_logging(verbosity)
        if metrics_port is not None:
            self._serve_metrics(metrics_host, metrics_port, database)
        signals = stop_signals.for_process()
        try:
            if signals.requested:
                logger.info("Stop requested while starting; exiting before any work.")
                return
            scheduler = Scheduler(workers=workers, using=database, stop=signals)
            self._run(scheduler, once=once, using=database)
        finally:
            stop_signals.release_process()

    def _run(self, scheduler: Scheduler, *, once: bool, using: str) -> None:
        """Run the scheduler, with retention pruning beside it in a thread of its own (not
        with ``--once``, which would end before the pruner's first pass)."""
        retention_pruner = None if once else pruner.Pruner(using)
        if retention_pruner:
            retention_pruner.start()
        try:
            scheduler.run(once=once)
        finally:
            if retention_pruner:
                retention_pruner.stop()

    def _serve_metrics(self, host: str, port: int, database: str) -> None:
        from django_periodic.operations import metrics

        try:
            address = metrics.serve(host, port, database)
        except (ImportError, OSError) as exc:
            raise CommandError(f"Cannot serve metrics on {host}:{port}: {exc}") from exc
        logger.info("Serving metrics on http://%s:%d/metrics", *address)

    def _configure_logging(self, verbosity: int) -> None:
        logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        runlog.logger.setLevel(RUN_LOG_LEVELS.get(verbosity, logging.INFO))
        runlog.follow()
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)


def _workers(option: int | None) -> int:
    """The worker threads: ``--workers``, in the WORKERS setting's range, or the setting."""
    if option is None:
        return get_settings().WORKERS
    valid = RANGES["WORKERS"]
    if option < valid.low:
        raise CommandError(f"--workers must be at least {valid.low} (or use --plan-only).")
    check_range("--workers", option, valid)
    return option
