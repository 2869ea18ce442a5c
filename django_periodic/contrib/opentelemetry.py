"""OpenTelemetry: a span per run attempt, per planning pass and per hand-off dispatch, and the
trace context carried to the tasks backend's workers (``OPENTELEMETRY``; needs
opentelemetry-api, the ``opentelemetry`` extra). See docs/opentelemetry.md.

``follow()`` installs the engine's tracer (``engine/tracing.py``) while the setting is on,
and removes it when a changed setting turns it off. Spans go to the global tracer provider
(``opentelemetry.trace.set_tracer_provider``), which the project may set up after Django
(in ``wsgi.py``, ``asgi.py`` or its own ``ready()``); ``start(tracer_provider)`` sends them
to another. Without the setting nothing is imported and nothing listens.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from importlib import metadata
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from django_periodic.choices import WARNING_STATUSES
from django_periodic.conf import SETTING_NAME, get_settings
from django_periodic.engine import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from django_periodic.engine.records import AttemptOutcome, Claim, LateRun, PlanResult

MISSING = (
    "OpenTelemetry is not installed: install django-periodic[opentelemetry] "
    "(pip install opentelemetry-api), and an SDK and exporter to send the spans."
)
#: The instrumentation scope of every span, and the prefix of their attributes.
SCOPE = "django_periodic"
#: What ``django_periodic.outcome`` says of an attempt this process gave up without an
#: outcome of its own (a shutdown, a lost lease): another process settles the run.
GIVEN_UP = "given_up"


def installed() -> bool:
    """Whether opentelemetry-api can be imported (imported, if so: tracing is on)."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def follow() -> None:
    """Trace while ``OPENTELEMETRY`` is on, from now on and whenever the setting changes."""
    setting_changed.connect(_setting_changed, dispatch_uid=f"{SCOPE}.opentelemetry")
    _follow_setting()


def start(tracer_provider: "TracerProvider | None" = None) -> None:
    """Trace to ``tracer_provider`` (None: the global one, even if it is set later).

    Raises ImportError (with what to install) without opentelemetry-api.
    """
    if not installed():
        raise ImportError(MISSING)
    tracing.install(_Tracer(tracer_provider))


def stop() -> None:
    """Stop tracing: the engine reports to no tracer."""
    tracing.install(None)


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _follow_setting()


def _follow_setting() -> None:
    # Not installed, the system check says so (django_periodic.E012); nothing is traced.
    if get_settings().OPENTELEMETRY and installed():
        if not isinstance(tracing.tracer, _Tracer):
            start()
    elif isinstance(tracing.tracer, _Tracer):
        stop()


class _Tracer:
    """The engine's tracer (``tracing.Tracer``), on opentelemetry-api."""

    def __init__(self, provider: "TracerProvider | None") -> None:
        from opentelemetry import trace

        # Before the global provider is set, the API's proxy tracer: it uses the provider
        # once one is set.
        self._tracer: Tracer = trace.get_tracer(SCOPE, _version(), tracer_provider=provider)

    def run(
        self, claim: "Claim", started_at: datetime | None, origin: tracing.Carrier | None
    ) -> "_RunSpan":
        from opentelemetry.trace import SpanKind

        run = claim.run
        span = self._tracer.start_span(
            f"run {run.schedule.name}",
            kind=SpanKind.CONSUMER,
            attributes=_run_attributes(claim, started_at),
            links=_links(origin),
        )
        return _RunSpan(span)

    def planned(self, started_ns: int, result: "PlanResult") -> None:
        if not (result.schedules or result.failed):
            return  # nothing was due after all (a run in flight held its fire back)
        span = self._tracer.start_span("plan", start_time=started_ns)
        span.set_attributes(
            {
                f"{SCOPE}.schedules": result.schedules,
                f"{SCOPE}.fired": result.fired,
                f"{SCOPE}.late": result.late,
                f"{SCOPE}.skipped": result.skipped,
                f"{SCOPE}.failed": len(result.failed),
                f"{SCOPE}.disabled": len(result.disabled),
            }
        )
        span.end()

    def late(self, runs: "list[LateRun]", now: datetime) -> None:
        # One span per late run, an error as a failed attempt's is: the run missed its
        # deadline to finish, whatever becomes of it.
        from opentelemetry.trace import Status, StatusCode

        for run in runs:
            span = self._tracer.start_span(f"late {run.schedule}", attributes=_late_attributes(run))
            span.set_attribute(f"{SCOPE}.late_by", run.late_by(now).total_seconds())
            message = f"Not finished by {run.finish_by.isoformat()}."
            span.set_status(Status(StatusCode.ERROR, message))
            span.end()

    @contextmanager
    def dispatching(self, runs: int) -> Iterator[tracing.Carrier]:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind

        attributes = {f"{SCOPE}.runs": runs}
        with self._tracer.start_as_current_span(
            "dispatch", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier


class _RunSpan:
    """One attempt's span (``tracing.RunSpan``)."""

    def __init__(self, span: "Span") -> None:
        self._span = span

    def current(self) -> AbstractContextManager[object]:
        from opentelemetry.trace import use_span

        # Its end and status are ours (end()), from the outcome: not when the job's call
        # returns, nor from an exception the executor turns into an outcome anyway.
        return use_span(
            self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    def end(self, outcome: "AttemptOutcome | None") -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute(f"{SCOPE}.outcome", GIVEN_UP if outcome is None else outcome.status)
        if outcome is not None and outcome.status in WARNING_STATUSES:
            span.set_attribute(f"{SCOPE}.error_code", outcome.error_code)
            if outcome.traceback:  # the job raised (not a timeout, an unknown job...)
                span.add_event("exception", _exception_event(outcome))
            span.set_status(Status(StatusCode.ERROR, outcome.error_message))
        span.end()


def _exception_event(outcome: "AttemptOutcome") -> dict[str, str]:
    """The exception as its run stores it: without the row values a database error quotes
    (error_texts.py), which record_exception()'s str() of the exception would keep."""
    return {
        "exception.type": outcome.error_code,
        "exception.message": outcome.error_message,
        "exception.stacktrace": outcome.traceback,
    }


def _version() -> str | None:
    try:
        return metadata.version("django-periodic")
    except metadata.PackageNotFoundError:  # run from a checkout
        return None


def _run_attributes(claim: "Claim", started_at: datetime | None) -> dict[str, Any]:
    run = claim.run
    attributes: dict[str, Any] = {
        f"{SCOPE}.run_id": run.pk,
        f"{SCOPE}.schedule": run.schedule.name,
        f"{SCOPE}.job": run.job_name,
        f"{SCOPE}.plan_time": run.plan_time.isoformat(),
        f"{SCOPE}.attempt": run.attempt,
        f"{SCOPE}.scope": run.scope,
        f"{SCOPE}.trigger": run.trigger,
    }
    if started_at is not None:
        lag = (started_at - run.release_time).total_seconds()
        attributes[f"{SCOPE}.start_lag"] = max(lag, 0.0)
    return attributes


def _late_attributes(run: "LateRun") -> dict[str, Any]:
    return {
        f"{SCOPE}.run_id": run.pk,
        f"{SCOPE}.schedule": run.schedule,
        f"{SCOPE}.plan_time": run.plan_time.isoformat(),
        f"{SCOPE}.finish_by": run.finish_by.isoformat(),
        f"{SCOPE}.attempt": run.attempt,
        f"{SCOPE}.scope": run.scope,
        f"{SCOPE}.status": run.status,
        f"{SCOPE}.cancelled": run.cancel,
    }


def _links(origin: tracing.Carrier | None) -> list[Any]:
    """A link to the span that dispatched the run's task, if its context came with it."""
    if not origin:
        return []
    from opentelemetry import propagate, trace

    context = trace.get_current_span(propagate.extract(origin)).get_span_context()
    return [trace.Link(context)] if context.is_valid else []
