"""Each run attempt's check-ins: ``in_progress`` when it starts, then ``ok`` or ``error``
when it ends, to its schedule's monitor.

The receivers run on the thread that sent the signal (a scheduler's loop, its recorder, a
task's worker): they only queue a ``CheckIn`` for the sender's thread
(operations/outbound.py), which reads the schedule's monitor config and calls
``sentry_sdk.crons.capture_checkin``. Configs are kept ``CONFIG_TTL`` seconds, and those of
every schedule with a check-in queued are read together: a burst of runs of many schedules
costs one query, never one per run. The check-in id is a function of the run and its
attempt, so the process that ends an attempt (another one's sweeper, after a lease was
lost) closes the check-in the starting process opened.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from django.db import DatabaseError, connections
from django.dispatch import Signal
from sentry_sdk.crons import MonitorStatus, capture_checkin

from django_periodic import signals
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.contrib.sentry import monitors
from django_periodic.operations import outbound
from django_periodic.operations.outbound import Sender

if TYPE_CHECKING:
    from sentry_sdk._types import MonitorConfig

logger = logging.getLogger("django_periodic")

# How long the sender reuses a schedule's monitor config before reading it again (seconds):
# an edit reaches Sentry with the check-ins after that.
CONFIG_TTL = 10.0
# Schedules whose configs one query reads at most (bound parameters stay few).
READ_BATCH = 500

SENDER = Sender("Sentry check-ins")
# (database alias, schedule id) -> (when it was read, its config); the sender's thread's.
_configs: dict[tuple[str, int], tuple[float, monitors.MonitorConfig | None]] = {}
# (database alias, schedule id) of check-ins queued since the last read: read together.
_wanted: set[tuple[str, int]] = set()


@dataclass(frozen=True)
class CheckIn:
    """One check-in to send: ``status`` of attempt ``attempt`` of run ``run_id`` of the
    schedule ``schedule_id`` (named ``schedule``). Its id and slug are made by the sender's
    thread: the receiver's only queues it."""

    using: str
    schedule_id: int
    schedule: str
    run_id: int
    attempt: int
    status: str
    duration: float | None = None


def check_in_id(run_id: int, attempt: int) -> str:
    """The id of the check-in of a run's attempt, the same in every process."""
    return outbound.attempt_id(run_id, attempt).hex


def started(**event: Any) -> None:
    _post(event, MonitorStatus.IN_PROGRESS)


def finished(status: str, duration: timedelta | None, **event: Any) -> None:
    # Without a duration, no attempt ran (a run no worker can claim, or cancelled before its
    # job started): the error goes to the current attempt's check-in all the same. Sentry
    # opens it if it is new, closes it if open, and ignores it if an attempt that was
    # retried already closed it.
    outcome = MonitorStatus.OK if status == RunStatus.SUCCEEDED else MonitorStatus.ERROR
    _post(event, outcome, duration=duration)


def retried(**event: Any) -> None:
    _post(event, MonitorStatus.ERROR)


def lease_lost(reentered: bool, **event: Any) -> None:
    # Not reentered: the run failed, and run_finished ends its check-in.
    if reentered:
        _post(event, MonitorStatus.ERROR)


def released(**event: Any) -> None:
    # Given back unfinished at shutdown, to run again: this attempt ended without an outcome.
    _post(event, MonitorStatus.ERROR)


def skipped(reason: str, **event: Any) -> None:
    # A run claimed ahead that waited past its start deadline: its check-in is open. Any
    # other skip never started, and Sentry reports the fire as missed.
    if reason == ErrorCode.START_DEADLINE and event["attempt"]:
        _post(event, MonitorStatus.ERROR)


def late(**event: Any) -> None:
    # Not finished by its deadline (finish_within): the attempt's check-in ends in error,
    # as an overrun of Sentry's own max_runtime does; a later ok is ignored by Sentry.
    _post(event, MonitorStatus.ERROR)


RECEIVERS: dict[Signal, Callable[..., None]] = {
    signals.run_started: started,
    signals.run_finished: finished,
    signals.run_retried: retried,
    signals.lease_lost: lease_lost,
    signals.run_released: released,
    signals.run_skipped: skipped,
    signals.run_late: late,
}


def _post(event: dict[str, Any], status: str, *, duration: timedelta | None = None) -> None:
    check_in = CheckIn(
        using=event["using"],
        schedule_id=event["schedule_id"],
        schedule=event["schedule"],
        run_id=event["run_id"],
        attempt=event["attempt"],
        status=status,
        duration=None if duration is None else max(duration.total_seconds(), 0.0),
    )
    _wanted.add((check_in.using, check_in.schedule_id))
    SENDER.post(partial(send, check_in))


def send(check_in: CheckIn) -> None:
    """Send a check-in through sentry-sdk (on the sender's thread), with its monitor's
    config."""
    capture_checkin(
        monitor_slug=monitors.monitor_slug(check_in.schedule),
        check_in_id=check_in_id(check_in.run_id, check_in.attempt),
        status=check_in.status,
        duration=check_in.duration,
        # Built as Sentry's TypedDict describes it (monitors.py).
        monitor_config=cast("MonitorConfig | None", _config(check_in.using, check_in.schedule_id)),
    )


def _config(using: str, schedule_id: int) -> monitors.MonitorConfig | None:
    cached = _configs.get((using, schedule_id))
    if cached is None or time.monotonic() - cached[0] >= CONFIG_TTL:
        _read(using, schedule_id)
        cached = _configs[(using, schedule_id)]
    return cached[1]


def _read(using: str, schedule_id: int) -> None:
    """Read the config of ``schedule_id`` and, in the same queries, of every schedule with
    a check-in queued since the last read: a burst of runs costs a query per ``READ_BATCH``
    schedules."""
    wanted = {key for key in _wanted.copy() if key[0] == using}
    _wanted.difference_update(wanted)
    ids = sorted({schedule_id, *(pk for _, pk in wanted)})
    found: dict[int, monitors.MonitorConfig | None] = {}
    try:
        for start in range(0, len(ids), READ_BATCH):
            found |= monitors.configs(ids[start : start + READ_BATCH], using)
    except DatabaseError:
        # The check-ins still go, without a config: Sentry keeps each monitor's last one.
        logger.warning("Sentry check-ins: monitor configs could not be read.", exc_info=True)
    finally:
        # The sender's thread keeps no connection between reads.
        connections[using].close()
    read_at = time.monotonic()
    for pk in ids:
        _configs[(using, pk)] = (read_at, found.get(pk))


def forget() -> None:
    """Forget the configs read (when the setting changes)."""
    _configs.clear()
    _wanted.clear()
