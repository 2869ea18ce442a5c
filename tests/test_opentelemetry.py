"""OpenTelemetry (``OPENTELEMETRY``): spans per run attempt, planning pass and hand-off
dispatch, recorded by opentelemetry-sdk's in-memory exporter on a real tracer provider.

The global tracer provider can be set once per process: the first test that needs it sets
an SDK provider (or adds the exporter to one already set), and every test empties the
exporter.
"""

import asyncio
import sys
from dataclasses import replace
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_periodic import checks, job, taskbackends, tasks
from django_periodic.contrib import opentelemetry
from django_periodic.db import clock
from django_periodic.engine import tracing
from django_periodic.engine.loop.context import StopRequest
from django_periodic.engine.loop.scheduler import Scheduler
from django_periodic.engine.runs import deadlines, handoff
from django_periodic.models import Run
from tests import ledger
from tests import spans as child_spans
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import claimed, set_cursor
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread

EXPORTER = InMemorySpanExporter()
_provider: list[TracerProvider] = []


def global_provider() -> TracerProvider:
    """The process's global SDK provider, exporting to ``EXPORTER``."""
    if not _provider:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        _provider.append(provider)
    return _provider[0]


@pytest.fixture
def spans(settings):
    """Tracing on (the setting, as a project sets it); the exporter, emptied."""
    global_provider()
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "OPENTELEMETRY": True}
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


@pytest.fixture(autouse=True)
def _close_async_connections():
    """Async jobs' ORM calls run on asgiref's thread, whose connection outlives the test."""
    yield
    closer = Thread(target=asyncio.run, args=(sync_to_async(connections.close_all)(),))
    closer.start()
    closer.join()


def named(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def only_run_span(exporter: InMemorySpanExporter):
    (span,) = named(exporter, "run ")
    return span


@job(name="tests.otel.traced")
def traced():
    """Opens a span of its own, as an instrumented library would."""
    with trace.get_tracer("tests").start_as_current_span("inside the job"):
        return "done"


@job(name="tests.otel.traced_async")
async def traced_async():
    with trace.get_tracer("tests").start_as_current_span("inside the async job"):
        return "done"


# Runs of our own workers and of tests.ledger (the task's way: run_job).


@pytest.mark.django_db
def test_a_successful_attempt_is_one_consumer_span_with_the_runs_attributes(spans, process, now):
    claim = claimed(process, now, name="nightly", job="tests.jobs.add", args=[2], kwargs={"b": 3})
    assert ledger.execute(claim) == "succeeded"
    run = Run.objects.get()
    span = only_run_span(spans)
    assert span.name == "run nightly"
    assert span.kind == SpanKind.CONSUMER
    assert span.status.status_code == StatusCode.UNSET
    attributes = dict(span.attributes)
    lag = attributes.pop("django_periodic.start_lag")
    assert attributes == {
        "django_periodic.run_id": run.pk,
        "django_periodic.schedule": "nightly",
        "django_periodic.job": "tests.jobs.add",
        "django_periodic.plan_time": run.plan_time.isoformat(),
        "django_periodic.attempt": 1,
        "django_periodic.scope": "",
        "django_periodic.trigger": "schedule",
        "django_periodic.outcome": "succeeded",
    }
    # The claim's time plus the time to the call: about the run's recorded start.
    assert abs(lag - (run.started_at - run.plan_time).total_seconds()) < 1.0


@pytest.mark.django_db
@pytest.mark.parametrize(("attempts", "status"), [(1, "failed"), (2, "retrying")])
def test_a_failed_attempt_has_error_status_and_the_exception(spans, process, now, attempts, status):
    claim = claimed(
        process, now, job="tests.jobs.explode", kwargs={"message": "kaput"}, max_attempts=attempts
    )
    assert ledger.execute(claim) == status
    span = only_run_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["django_periodic.outcome"] == status
    assert span.attributes["django_periodic.error_code"] == "RuntimeError"
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "RuntimeError"
    assert event.attributes["exception.message"] == "kaput"
    assert "raise RuntimeError(message)" in event.attributes["exception.stacktrace"]


@pytest.mark.django_db
def test_a_job_that_is_no_longer_registered_fails_its_span(spans, process, now):
    claim = claimed(process, now)
    Run.objects.update(job_name="tests.jobs.gone")
    claim = replace(claim, values=replace(claim.values, job_name="tests.jobs.gone"))
    assert ledger.execute(claim) == "failed"
    span = only_run_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["django_periodic.error_code"] == "unknown_job"


@pytest.mark.django_db
def test_the_jobs_own_spans_are_children_of_its_attempt(spans, process, now, clean_registry):
    claim = claimed(process, now, job="tests.otel.traced")
    assert ledger.execute(claim) == "succeeded"
    run_span = only_run_span(spans)
    (inside,) = named(spans, "inside the job")
    assert inside.parent.span_id == run_span.context.span_id
    assert inside.context.trace_id == run_span.context.trace_id


@pytest.mark.django_db(transaction=True)
def test_an_async_jobs_spans_are_children_of_its_attempt(spans, process, now, clean_registry):
    claim = claimed(process, now, job="tests.otel.traced_async")
    assert ledger.execute(claim) == "succeeded"
    run_span = only_run_span(spans)
    (inside,) = named(spans, "inside the async job")
    assert inside.parent.span_id == run_span.context.span_id
    assert run_span.attributes["django_periodic.outcome"] == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_an_atomic_jobs_attempt_ends_with_its_committed_outcome(spans, process, now):
    claim = claimed(process, now, job="tests.jobs.atomic_record")
    assert ledger.execute(claim) == "succeeded"
    assert Execution.objects.count() == 1
    assert only_run_span(spans).attributes["django_periodic.outcome"] == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_an_atomic_job_that_raises_rolls_back_and_fails_its_span(spans, process, now):
    claim = claimed(process, now, job="tests.jobs.atomic_with_hook", kwargs={"fail": True})
    assert ledger.execute(claim) == "failed"
    assert Execution.objects.count() == 0
    span = only_run_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.events[0].attributes["exception.message"] == "fails after writing"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reason", "returned", "outcome", "code"),
    [
        (StopRequest.SHUTDOWN, None, opentelemetry.GIVEN_UP, StatusCode.UNSET),
        (StopRequest.CANCEL, "cancelled", "cancelled", StatusCode.UNSET),
        (StopRequest.TIMEOUT, "failed", "failed", StatusCode.ERROR),
    ],
)
def test_an_attempt_stopped_while_running_ends_its_span_so(
    spans, process, now, reason, returned, outcome, code
):
    claim = claimed(process, now, job="tests.jobs.linger_async", kwargs={"seconds": 600})
    stop = StopRequest()
    statuses: list = []

    def work() -> None:
        try:
            statuses.append(ledger.execute(claim, stop))
        finally:
            connections.close_all()  # this thread's own connection

    thread = Thread(target=work)
    thread.start()
    wait_for(Execution.objects.exists, 10, "the job to start")
    stop.set(reason)
    thread.join(timeout=10)
    assert statuses == [returned]
    span = only_run_span(spans)
    assert span.attributes["django_periodic.outcome"] == outcome
    assert span.status.status_code == code
    assert span.events == ()  # a stop is no exception of the job's
    if returned is None:  # nothing recorded: the scheduler releases the run, by token
        assert ledger.release(claim, now)


@pytest.mark.django_db(transaction=True)
def test_the_schedulers_workers_trace_sync_and_async_runs(spans, now, clean_registry):
    sync_run = RunFactory(schedule=ScheduleFactory(name="sync", job="tests.otel.traced"))
    async_run = RunFactory(schedule=ScheduleFactory(name="async", job="tests.otel.traced_async"))
    Scheduler(workers=2, plan=False).run(once=True)
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    for run, inside_name in ((sync_run, "inside the job"), (async_run, "inside the async job")):
        (run_span,) = named(spans, f"run {run.schedule.name}")
        (inside,) = named(spans, inside_name)
        assert inside.parent.span_id == run_span.context.span_id
        assert run_span.attributes["django_periodic.run_id"] == run.pk


@pytest.mark.django_db(transaction=True)
def test_a_fanned_out_runs_span_names_its_scope(spans, now):
    schedule = ScheduleFactory(job="tests.jobs.per_tenant", scopes="tests.regions")
    set_cursor(schedule, now)
    Scheduler(workers=1).run(once=True)
    scopes = {span.attributes["django_periodic.scope"] for span in named(spans, "run ")}
    assert scopes == set(Run.objects.values_list("scope", flat=True)) == {"eu", "us"}


# Planning passes.


@pytest.mark.django_db(transaction=True)
def test_a_planning_pass_is_a_span_with_its_counts(spans, now):
    due = ScheduleFactory(name="due")
    set_cursor(due, now - timedelta(seconds=1))
    missed = ScheduleFactory(name="missed", misfire="skip", misfire_grace=timedelta(seconds=1))
    set_cursor(missed, now - timedelta(minutes=10))
    Scheduler(workers=0).run(once=True)
    (plan,) = named(spans, "plan")
    skipped = Run.objects.filter(status="skipped").count()
    fired = Run.objects.exclude(status="skipped").count()
    assert fired and skipped  # "missed" skipped the plan times past its grace
    assert {k: v for k, v in plan.attributes.items() if k != "django_periodic.late"} == {
        "django_periodic.schedules": 2,
        "django_periodic.fired": fired,
        "django_periodic.skipped": skipped,
        "django_periodic.failed": 0,
        "django_periodic.disabled": 0,
    }
    assert plan.kind == SpanKind.INTERNAL


@pytest.mark.django_db(transaction=True)
def test_a_pass_with_nothing_due_makes_no_span(spans, now):
    ScheduleFactory()  # due in a minute
    Scheduler(workers=0).run(once=True)  # boot's pass, and a tick's look ahead
    assert spans.get_finished_spans() == ()


# The hand-off: the dispatch's trace context carried to the worker's attempt.


@pytest.fixture
def dummy():
    backend = taskbackends.framework().task_backends["dummy"]
    backend.clear()
    yield backend
    backend.clear()


def handed_off(now, backend="dummy") -> Run:
    schedule = ScheduleFactory(job="tests.jobs.record", tasks_backend=backend)
    return RunFactory(schedule=schedule, plan_time=now, tasks_backend=backend)


@pytest.mark.django_db(transaction=True)
def test_a_workers_attempt_links_to_the_dispatch_that_enqueued_it(spans, now, dummy):
    handed_off(now)
    handed_off(now)
    assert handoff.dispatch() == 2
    (dispatch,) = named(spans, "dispatch")
    assert dispatch.kind == SpanKind.PRODUCER
    assert dispatch.attributes["django_periodic.runs"] == 2
    for result in dummy.results:
        # As a backend's worker calls it, in a trace of its own.
        assert result.task.call(*result.args, **result.kwargs) == "succeeded"
    attempts = named(spans, "run ")
    assert len(attempts) == 2
    for attempt in attempts:
        (link,) = attempt.links
        assert link.context.trace_id == dispatch.context.trace_id
        assert link.context.span_id == dispatch.context.span_id
        assert attempt.context.trace_id != dispatch.context.trace_id  # linked, not a child


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_traces_through_the_immediate_backend(spans, now, settings):
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "TASKS_BACKEND": "default"}
    ScheduleFactory(job="tests.jobs.record", interval=None, run_at=now)
    Scheduler(workers=0).run(once=True)
    assert Run.objects.get().status == "succeeded"
    (dispatch,) = named(spans, "dispatch")
    attempt = only_run_span(spans)
    assert [link.context.span_id for link in attempt.links] == [dispatch.context.span_id]
    (plan,) = named(spans, "plan")
    assert plan.attributes["django_periodic.fired"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_by_the_previous_release_runs_without_a_link(spans, now):
    run = handed_off(now)
    # What the previous release enqueues: the run's id and alias, no trace context.
    assert tasks.execute_run_on("dummy").call(run.pk, "default") == "succeeded"
    assert only_run_span(spans).links == ()


@pytest.mark.django_db(transaction=True)
def test_without_the_setting_tasks_carry_no_trace_context(now, dummy):
    handed_off(now)
    handoff.dispatch()
    (result,) = dummy.results
    assert (result.args, result.kwargs) == ([Run.objects.get().pk, "default"], {})


# Off, and the check.


@pytest.mark.django_db(transaction=True)
def test_off_nothing_is_traced(now, settings):
    global_provider()
    EXPORTER.clear()
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "OPENTELEMETRY": True}
    assert tracing.tracer is not None
    settings.DJANGO_PERIODIC = {**settings.DJANGO_PERIODIC, "OPENTELEMETRY": False}
    assert tracing.tracer is None
    set_cursor(ScheduleFactory(), now)
    Scheduler(workers=1).run(once=True)
    assert Run.objects.filter(status="succeeded").exists()  # planned and ran
    assert EXPORTER.get_finished_spans() == ()


def test_start_sends_spans_to_the_provider_given(db, process, now):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    opentelemetry.start(provider)
    try:
        assert ledger.execute(claimed(process, now)) == "succeeded"
    finally:
        opentelemetry.stop()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["django_periodic.outcome"] == "succeeded"
    assert tracing.tracer is None


def test_checks_say_what_to_install_without_opentelemetry(settings, monkeypatch):
    settings.DJANGO_PERIODIC = {"OPENTELEMETRY": True}
    assert checks.check_opentelemetry() == []
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # as if not installed
    (error,) = checks.check_opentelemetry()
    assert error.id == "django_periodic.E012"
    assert "django-periodic[opentelemetry]" in error.hint


# Real processes: run_scheduler and django-tasks-db's db_worker, their spans written to files.


def spans_env(path) -> dict[str, str]:
    return {child_spans.VARIABLE: str(path)}


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_run_scheduler_process_traces_its_planning_and_its_runs(children, now, tmp_path):
    path = tmp_path / "scheduler.jsonl"
    schedule = ScheduleFactory(job="tests.jobs.open_a_span", interval=None, run_at=now)
    scheduler = children.start(
        "--workers", "1", settings={"OPENTELEMETRY": True}, env=spans_env(path)
    )
    wait_for(lambda: Run.objects.filter(status="succeeded").exists(), 30, "the run to succeed")
    # Each span is written as it ends: the job's, then its attempt's.
    wait_for(lambda: child_spans.named(child_spans.read(path), "run "), 30, "the attempt's span")
    assert scheduler.terminate() == 0, scheduler.output()
    written = child_spans.read(path)
    (plan,) = child_spans.named(written, "plan")
    assert plan["attributes"]["django_periodic.fired"] == 1
    (attempt,) = child_spans.named(written, "run ")
    assert attempt["name"] == f"run {schedule.name}"
    assert attempt["attributes"]["django_periodic.run_id"] == Run.objects.get().pk
    (inside,) = child_spans.named(written, "inside the job")
    assert inside["parent_id"] == attempt["context"]["span_id"]


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_db_workers_attempt_links_to_the_schedulers_dispatch(children, postgres, now, tmp_path):
    scheduler_path, worker_path = tmp_path / "scheduler.jsonl", tmp_path / "worker.jsonl"
    settings = {"OPENTELEMETRY": True, "TASKS_BACKEND": "database", "POLL_INTERVAL": 0.5}
    ScheduleFactory(job="tests.jobs.open_a_span", interval=None, run_at=now)
    children.start_worker(settings=settings, env=spans_env(worker_path))
    scheduler = children.start("--plan-only", settings=settings, env=spans_env(scheduler_path))
    wait_for(lambda: Run.objects.filter(status="succeeded").exists(), 60, "the run to succeed")
    wait_for(
        lambda: child_spans.named(child_spans.read(worker_path), "run "), 30, "the attempt's span"
    )
    assert scheduler.terminate() == 0, scheduler.output()
    (dispatch,) = child_spans.named(child_spans.read(scheduler_path), "dispatch")
    worker_spans = child_spans.read(worker_path)
    (attempt,) = child_spans.named(worker_spans, "run ")
    assert [link["context"] for link in attempt["links"]] == [dispatch["context"]]
    assert attempt["context"]["trace_id"] != dispatch["context"]["trace_id"]
    (inside,) = child_spans.named(worker_spans, "inside the job")
    assert inside["parent_id"] == attempt["context"]["span_id"]


@pytest.mark.django_db
def test_a_late_run_is_one_error_span_once(spans):
    schedule = ScheduleFactory(finish_within=timedelta(minutes=10), cancel_when_late=True)
    now = clock.now()
    run = RunFactory(
        schedule=schedule,
        plan_time=now - timedelta(hours=1),
        finish_by=now - timedelta(minutes=50),
        status="retrying",
    )
    deadlines.flag_late(now)
    deadlines.flag_late(now)  # found once
    (span,) = spans.get_finished_spans()
    assert span.name == f"late {schedule.name}"
    assert span.status.status_code == StatusCode.ERROR
    attributes = dict(span.attributes)
    assert attributes["django_periodic.run_id"] == run.pk
    assert attributes["django_periodic.late_by"] == 3000.0
    assert attributes["django_periodic.status"] == "retrying"
    assert attributes["django_periodic.cancelled"] is True
