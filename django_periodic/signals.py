"""Signals: what happened to runs and schedules, sent once it has committed.

Every run signal is sent with ``sender=Run`` (the model class) and the keyword arguments
of ``RUN_ARGUMENTS``; ``run_started`` adds ``started_at`` and ``release_time``,
``run_finished`` adds
``duration``, ``lease_lost`` adds ``reentered``, ``run_late`` adds ``finish_by``,
``late_by`` and ``cancelled``. ``schedule_disabled`` is sent with
``sender=Schedule`` and ``schedule_id``, ``schedule`` (its name), ``error`` and ``using``;
``schedule_needs_attention`` and ``schedule_recovered`` with ``sender=Schedule`` and the
keyword arguments of ``ATTENTION_ARGUMENTS``; ``schedule_paused`` with ``sender=Schedule``
and ``schedule_id``, ``schedule``, ``until``, ``reason``, ``by`` and ``using``. See
docs/signals.md.

A change made in a transaction is announced after it commits (``transaction.on_commit``),
and never if it rolls back. Receivers run in the thread that made the change (a
scheduler's loop, its recorder, a task's worker): they must be quick, and one that raises
is logged, never allowed to stop the scheduler.

Nothing is built for a signal nobody listens to (``listened()``): the executor records
thousands of runs a second, and a transition must cost nothing unless someone asked.
"""

import logging
from typing import Any

from django.apps import apps
from django.dispatch import Signal

from django_periodic.choices import RunStatus

logger = logging.getLogger("django_periodic")

#: A run was recorded, pending (or queued behind another by its overlap policy): by the
#: planner for a fire, by ``run_now()`` or a retry from the admin; or by a backfill,
#: waiting for its release (retrying, attempt 0).
run_planned = Signal()
#: A worker claimed the run: it is running, attempt ``attempt``, since ``started_at``; it
#: was due at ``release_time`` (its plan time, or later by its schedule's jitter).
run_started = Signal()
#: The run ended ``succeeded``, ``failed`` or ``cancelled`` (``status``), ``reason`` the
#: error code of a failure ("" for a success); ``duration`` how long its last attempt ran.
run_finished = Signal()
#: An attempt failed with attempts left: the run waits to be retried (``status`` retrying).
run_retried = Signal()
#: The run was recorded or ended ``skipped``: ``reason`` says why (``missed``,
#: ``overlap``, ``start_deadline``, see ``policies``).
run_skipped = Signal()
#: The sweeper released the run's expired lease: its process stopped heartbeating. The
#: run goes back to pending (``reentered``) or ends failed ``lease_expired``.
lease_lost = Signal()
#: A scheduler stopping gave back a run whose job had started and not ended within
#: ``SHUTDOWN_GRACE``: its attempt ended unfinished, and the run goes back to pending to
#: run again (a run not run again ends failed ``interrupted``: ``run_finished``).
run_released = Signal()
#: The run was not finished by its deadline (its plan time plus its schedule's
#: ``finish_within``): sent once per run, by the one scheduler that found it late, with
#: ``finish_by``, ``late_by`` (how far past it when found) and ``cancelled`` (whether its
#: schedule's ``cancel_when_late`` cancelled it, or asked its running job to stop).
run_late = Signal()
#: The planner disabled a schedule it failed to plan ``PLANNING_FAILURE_LIMIT`` times, or
#: whose job no live process has had for ``UNKNOWN_JOB_GRACE``.
schedule_disabled = Signal()
#: A schedule that was fine needs attention now (models/alerting.py): sent once, by the
#: one scheduler that wrote the change.
schedule_needs_attention = Signal()
#: A schedule that needed attention does not any more: it succeeded, or it was disabled,
#: or its alerts were removed. Sent once, like ``schedule_needs_attention``.
schedule_recovered = Signal()
#: The scheduler paused a schedule after ``pause_after_failures`` failed runs in a row,
#: until resumed (docs/policies.md, "Lifecycle"): sent once, by the scheduler that paused it.
schedule_paused = Signal()

SCHEDULE_SIGNALS = (
    schedule_disabled,
    schedule_needs_attention,
    schedule_recovered,
    schedule_paused,
)

RUN_SIGNALS = (
    run_planned,
    run_started,
    run_finished,
    run_retried,
    run_skipped,
    lease_lost,
    run_released,
    run_late,
)

#: What every run signal sends (besides ``sender`` and ``signal``).
RUN_ARGUMENTS = (
    "run_id",  # int
    "schedule_id",  # int
    "schedule",  # str: the schedule's name
    "scope",  # str: the scope key of a fanned-out schedule's run, else ""
    "plan_time",  # datetime: the fire time the run is for
    "attempt",  # int: attempts started so far (0 before the first)
    "status",  # str: the run's status after the transition (Run.Status)
    "reason",  # str: why it was skipped or failed (the run's error_code), else ""
    "using",  # str: the database alias
)

#: What the attention signals send (besides ``sender`` and ``signal``).
ATTENTION_ARGUMENTS = (
    "schedule_id",  # int
    "schedule",  # str: the schedule's name
    "reason",  # str: an AttentionReason; for schedule_recovered, the one that ended
    "message",  # str: the reason in words, with the schedule's threshold
    "since",  # datetime: when it began to need attention
    "using",  # str: the database alias
)

Event = tuple[Signal, dict[str, Any]]


def listened(*signals: Signal) -> bool:
    """Whether any of these signals has a receiver: a check of a list, cheap enough for
    once per batch."""
    return any(signal.receivers for signal in signals)


def run_event(
    signal: Signal,
    *,
    run_id: int | None,
    schedule_id: int,
    schedule: str,
    scope: str,
    plan_time: Any,
    attempt: int,
    status: str,
    reason: str = "",
    using: str = "default",
    **extra: Any,
) -> Event:
    """A run signal's event, with every argument of ``RUN_ARGUMENTS``."""
    arguments = {
        "run_id": run_id,
        "schedule_id": schedule_id,
        "schedule": schedule,
        "scope": scope,
        "plan_time": plan_time,
        "attempt": attempt,
        "status": str(status),  # a plain str, never Run.Status (a str subclass)
        "reason": reason,
        "using": using,
    }
    return signal, arguments | extra


def of_run(signal: Signal, run: Any, **overrides: Any) -> Event:
    """A run signal's event for a ``Run`` (its schedule loaded, or cached on it); keyword
    arguments replace the run's own values (an outcome's status before it is saved on the
    instance) or add the signal's extra ones."""
    fields = {
        "run_id": run.pk,
        "schedule_id": run.schedule_id,
        "schedule": run.schedule.name,
        "scope": run.scope,
        "plan_time": run.plan_time,
        "attempt": run.attempt,
        "status": run.status,
        "reason": run.error_code,
        "using": run._state.db or "default",
    }
    return run_event(signal, **(fields | overrides))


def recorded(run: Any) -> Event:
    """``run_planned`` (or ``run_skipped``) for a run just recorded."""
    return of_run(run_skipped if run.status == RunStatus.SKIPPED else run_planned, run)


def send(events: list[Event]) -> None:
    """Send events now, each to every receiver; a receiver that raises is logged."""
    # Looked up, not imported: the models send these signals, so they import this module.
    for signal, arguments in events:
        name = "Schedule" if signal in SCHEDULE_SIGNALS else "Run"
        sender = apps.get_model("django_periodic", name)
        for receiver, response in signal.send_robust(sender, **arguments):
            if isinstance(response, Exception):
                logger.error("Signal receiver %r raised.", receiver, exc_info=response)
