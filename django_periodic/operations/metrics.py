"""Prometheus metrics, served by ``run_scheduler --metrics-port`` (needs prometheus-client,
the ``metrics`` extra). See docs/metrics.md.

Counters and histograms count what this process saw happen, fed by the signals
(``signals.py``) and connected only once ``serve()`` is called: without it, or without
prometheus-client, nothing listens and nothing is imported. Gauges are the database's
view, shared by every scheduler, read when Prometheus scrapes (three aggregate queries; a
fourth for the per-schedule series of ``METRICS_SCHEDULE_LABELS``).
The metrics live in their own registry (``registry()``), not prometheus-client's global
one: only what is ours is served. ``registry()`` and ``serve()`` are public, at this path.
"""

from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connections
from django.db.models import Count, Q

from django_periodic import signals
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.models.run import RELEASE

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

PREFIX = "django_periodic_"
# Lag and duration buckets, in seconds: from a scheduler's milliseconds to an hour's job.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
MISSING = (
    "prometheus-client is not installed: install django-periodic[metrics] "
    "(pip install prometheus-client)."
)

_metrics: "_Metrics | None" = None


class _Metrics:
    """The counters and histograms, and the receivers that feed them."""

    def __init__(self, using: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.fired = Counter(
            f"{PREFIX}runs_fired", "Runs planned to start (fires, manual runs).", registry=registry
        )
        self.succeeded = Counter(
            f"{PREFIX}runs_succeeded", "Runs that ended succeeded.", registry=registry
        )
        self.failed = Counter(
            f"{PREFIX}runs_failed",
            "Runs that ended failed or cancelled, by status and error code.",
            ["status", "reason"],
            registry=registry,
        )
        self.skipped = Counter(
            f"{PREFIX}runs_skipped", "Runs skipped, by reason.", ["reason"], registry=registry
        )
        self.retried = Counter(
            f"{PREFIX}runs_retried", "Failed attempts that will be retried.", registry=registry
        )
        self.leases_lost = Counter(
            f"{PREFIX}leases_lost",
            "Leases the sweeper found expired (their process stopped heartbeating).",
            registry=registry,
        )
        self.lag = Histogram(
            f"{PREFIX}fire_lag_seconds",
            "From a run's plan time to its start.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            f"{PREFIX}run_duration_seconds",
            "How long finished runs' last attempts ran.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        registry.register(_StateCollector(using))
        signals.run_planned.connect(self.on_planned, weak=False)
        signals.run_started.connect(self.on_started, weak=False)
        signals.run_finished.connect(self.on_finished, weak=False)
        signals.run_retried.connect(self.on_retried, weak=False)
        signals.run_skipped.connect(self.on_skipped, weak=False)
        signals.lease_lost.connect(self.on_lease_lost, weak=False)

    def on_planned(self, **kwargs: Any) -> None:
        self.fired.inc()

    def on_started(self, release_time: Any, started_at: Any, **kwargs: Any) -> None:
        if started_at is not None:
            self.lag.observe(max((started_at - release_time).total_seconds(), 0.0))

    def on_finished(
        self, status: str, reason: str, duration: timedelta | None, **kwargs: Any
    ) -> None:
        if status == Run.Status.SUCCEEDED:
            self.succeeded.inc()
        else:
            self.failed.labels(status, reason).inc()
        if duration is not None:
            self.duration.observe(max(duration.total_seconds(), 0.0))

    def on_retried(self, **kwargs: Any) -> None:
        self.retried.inc()

    def on_skipped(self, reason: str, **kwargs: Any) -> None:
        self.skipped.labels(reason).inc()

    def on_lease_lost(self, **kwargs: Any) -> None:
        self.leases_lost.inc()


class _StateCollector:
    """Gauges read from the database at each scrape: runs running and waiting to start, live
    schedulers, schedules needing attention (and, with ``METRICS_SCHEDULE_LABELS``, one
    series per schedule with alerts). A scrape runs on the exporter's own thread: its
    connection is closed after each, as a request's would be."""

    def __init__(self, using: str) -> None:
        self.using = using

    def describe(self) -> list["Metric"]:
        return []  # read from the database: nothing to query when the collector registers

    def collect(self) -> Iterator["Metric"]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            close_old_connections()
            running, waiting, live = self._counts()
            needing = Schedule.objects.using(self.using).needing_attention().count()
            per_schedule = self._per_schedule() if get_settings().METRICS_SCHEDULE_LABELS else None
        finally:
            connections[self.using].close()
        yield GaugeMetricFamily(f"{PREFIX}runs_running", "Runs running now.", value=running)
        yield GaugeMetricFamily(
            f"{PREFIX}runs_queued",
            "Runs waiting to start: pending and due, or queued behind another run.",
            value=waiting,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}schedulers_live", "Scheduler processes heartbeating.", value=live
        )
        yield GaugeMetricFamily(
            f"{PREFIX}schedules_needing_attention",
            "Schedules that need attention by their alerts.",
            value=needing,
        )
        if per_schedule is not None:
            family = GaugeMetricFamily(
                f"{PREFIX}schedule_needs_attention",
                "1 while the schedule needs attention by its alerts, else 0.",
                labels=["schedule"],
            )
            for name, reason in per_schedule:
                family.add_metric([name], 1 if reason else 0)
            yield family

    def _per_schedule(self) -> list[tuple[str, str]]:
        """(name, attention_reason) of every schedule with alerts or needing attention."""
        schedules = Schedule.objects.using(self.using)
        shown = schedules.with_alerts() | schedules.needing_attention()
        return list(shown.order_by("name").values_list("name", "attention_reason"))

    def _counts(self) -> tuple[int, int, int]:
        now = clock.now(self.using)
        due = Q(status=Run.Status.PENDING, release__lte=now)
        # Only active runs (a partial index), never the whole history.
        active = Run.objects.using(self.using).active().alias(release=RELEASE)
        runs = active.aggregate(
            running=Count("pk", filter=Q(status=Run.Status.RUNNING)),
            waiting=Count("pk", filter=due | Q(status=Run.Status.QUEUED)),
        )
        live = SchedulerProcess.objects.using(self.using).alive(now).count()
        return runs["running"], runs["waiting"], live


def registry(using: str = "default") -> "CollectorRegistry":
    """This process's metrics registry; its receivers connect on the first call.

    Raises ImportError (with what to install) without prometheus-client.
    """
    global _metrics
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    if _metrics is None:
        _metrics = _Metrics(using)
    return _metrics.registry


def serve(host: str, port: int, using: str = "default") -> tuple[str, int]:
    """Serve the metrics over HTTP at ``host:port`` (/metrics) from a daemon thread; return
    the address bound (port 0 picks a free one)."""
    served = registry(using)
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, host, registry=served)
    bound_host, bound_port = server.server_address[:2]
    return str(bound_host), int(bound_port)
