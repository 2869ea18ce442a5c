"""The engine's hook for tracing: what it tells a tracer about each run attempt, planning
pass and hand-off. ``django_periodic.contrib.opentelemetry`` installs one when the
``OPENTELEMETRY`` setting is on (docs/opentelemetry.md); the engine cannot import it.

Off, ``tracer`` is None and each place that would trace checks that once and does nothing
else: no span, no context, no import of OpenTelemetry.
"""

from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from django_periodic.engine.records import AttemptOutcome, Claim, LateRun, PlanResult

# A trace context as text headers (W3C ``traceparent``, ``tracestate``), as carried by a
# handed-off run's task.
Carrier = Mapping[str, str]


class RunSpan(Protocol):
    """The trace of one run attempt, from the call of its job to its outcome."""

    def current(self) -> AbstractContextManager[object]:
        """Make this attempt the current trace context while its job runs: the job's own
        spans are its children."""

    def end(self, outcome: "AttemptOutcome | None") -> None:
        """The attempt ended with ``outcome`` (None: given up here, for a shutdown or a
        lost lease)."""


class Tracer(Protocol):
    """What the engine tells a tracer, from the thread where it happens."""

    def run(self, claim: "Claim", started_at: datetime | None, origin: Carrier | None) -> RunSpan:
        """An attempt of the claimed run starts its job at ``started_at``; ``origin`` is the
        trace context its task carried from the dispatching scheduler, if any."""

    def planned(self, started_ns: int, result: "PlanResult") -> None:
        """A planning pass that began at ``started_ns`` (``time.time_ns()``) ended now with
        ``result``."""

    def dispatching(self, runs: int) -> AbstractContextManager[Carrier]:
        """``runs`` handed-off runs are being enqueued: within, the trace context each of
        their tasks carries."""

    def late(self, runs: "list[LateRun]", now: datetime) -> None:
        """These runs were found at ``now`` unfinished past their deadline to finish
        (engine/runs/deadlines.py), each once across every process."""


#: The tracer the engine reports to; None (the default) when tracing is off.
tracer: Tracer | None = None


def install(installed: Tracer | None) -> None:
    """Report to ``installed`` from now on (None: stop tracing)."""
    global tracer
    tracer = installed
