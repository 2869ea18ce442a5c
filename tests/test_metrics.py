"""run_scheduler --metrics-port: Prometheus metrics from a real scheduler process, scraped
over HTTP. In a child process only: the metrics' receivers stay connected once started."""

import re
import urllib.request
from datetime import timedelta

import pytest

from tests.factories import ScheduleFactory
from tests.processes import ROOT, wait_for

pytestmark = pytest.mark.processes


def scrape(url: str) -> dict[str, float]:
    """The samples served at ``url``: name with labels -> value."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def metrics_url(child) -> str:
    line = child.wait_for_line("Serving metrics on")
    return re.search(r"(http://\S+/metrics)", line).group(1)


def test_a_scheduler_serves_counters_histograms_and_gauges_that_move(children):
    ScheduleFactory(job="tests.jobs.add", args=[1, 2], interval=timedelta(seconds=1))
    ScheduleFactory(job="tests.jobs.explode", interval=timedelta(seconds=1), max_attempts=1)
    child = children.start("--metrics-port=0", "--workers=2")
    url = metrics_url(child)
    assert url.startswith("http://127.0.0.1:")  # loopback unless told otherwise

    def moved() -> dict[str, float] | None:
        samples = scrape(url)
        succeeded = samples.get("django_periodic_runs_succeeded_total", 0)
        failed = samples.get(
            'django_periodic_runs_failed_total{reason="RuntimeError",status="failed"}', 0
        )
        return samples if succeeded >= 2 and failed >= 1 else None

    samples = wait_for(moved, 30, "succeeded and failed runs counted")
    assert samples["django_periodic_runs_fired_total"] >= 3
    assert samples["django_periodic_fire_lag_seconds_count"] >= 3
    assert samples["django_periodic_run_duration_seconds_count"] >= 3
    assert samples["django_periodic_schedulers_live"] == 1
    assert "django_periodic_runs_running" in samples
    assert "django_periodic_runs_queued" in samples
    assert child.terminate() == 0


def test_without_prometheus_client_the_metrics_port_is_a_clear_error(children, tmp_path):
    # prometheus-client "not installed": a module of its name that cannot be imported.
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    child = children.start("--metrics-port=0", env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert child.wait() == 1
    assert "install django-periodic[metrics]" in child.output()
