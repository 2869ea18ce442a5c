"""Spans of child processes (real ``run_scheduler`` and task workers), written as JSON lines
to the file ``PERIODIC_TEST_SPANS_FILE`` names, for tests to read what they traced.

tests.settings sets this up in a child given the variable, as a project sets up its tracer
provider: the global one, with opentelemetry-sdk's console exporter writing to the file.
"""

import json
from pathlib import Path
from typing import Any

VARIABLE = "PERIODIC_TEST_SPANS_FILE"


def export_to(path: str) -> None:
    """Send this process's spans to ``path``, one JSON object per line, as each ends."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    stream = open(path, "a", buffering=1)  # noqa: SIM115  (open as long as the process)
    exporter = ConsoleSpanExporter(
        out=stream, formatter=lambda span: span.to_json(indent=None) + "\n"
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def read(path: Path) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"].startswith(prefix)]
