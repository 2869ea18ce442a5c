"""The closed sets of strings the app stores, one ``TextChoices`` each.

Used alike by the models, the planner's decisions, the forms and the admin; beside the
trigger kinds, the field that carries each (``KIND_FIELDS``) and its value unset. Importing
this module loads no models, so pure code (``policies.py``, ``registry.py``) can use the
same values.
"""

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    RETRYING = "retrying", _("retrying")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    SKIPPED = "skipped", _("skipped")
    CANCELLED = "cancelled", _("cancelled")


# Not started (or not restarted) yet.
WAITING_STATUSES = (RunStatus.PENDING, RunStatus.QUEUED, RunStatus.RETRYING)
# Not final: waiting or running (in the order of the periodic_run_active index).
ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RETRYING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.CANCELLED)
# Hold a non-concurrent schedule's one active slot (a queued run waits for it).
SLOT_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.RETRYING)
# A worker may claim them when due (and a claim that cannot take one fails it).
CLAIMABLE_STATUSES = (RunStatus.PENDING, RunStatus.RETRYING)
# Failures, which stand out in the logs: an attempt that ends in one logs at WARNING, in the
# executor's log and in the run log (operations/runlog.py); every other status at INFO.
WARNING_STATUSES = frozenset({RunStatus.FAILED, RunStatus.RETRYING})

# The ledger format this release reads (``SchedulerProcess.ledger_format``). Schedules and
# runs carry the format a process must read to handle them (``ledger_format``, this one by
# default): a later release that stores something this one cannot read (a trigger kind, a
# status, a field value) marks those rows with a higher format, and this release's
# processes leave them alone (``ScheduleQuerySet.readable``, ``RunQuerySet.of_jobs``).
LEDGER_FORMAT = 1


class RunTrigger(models.TextChoices):
    SCHEDULE = "schedule", _("scheduled")
    MANUAL = "manual", _("manual")
    RETRY = "retry", _("retry")
    BACKFILL = "backfill", _("backfill")


# Triggers whose runs are the ledger: at most one per (schedule, scope, plan time).
LEDGER_TRIGGERS = (RunTrigger.SCHEDULE, RunTrigger.BACKFILL)


class ScheduleKind(models.TextChoices):
    """A schedule's kind of trigger."""

    CRON = "cron", _("cron")
    INTERVAL = "interval", _("interval")
    ONCE = "once", _("one-shot")
    RRULE = "rrule", _("RRULE (RFC 5545)")
    # No clock: it fires for each plan time its upstream schedules have run (Schedule.after).
    AFTER = "after", _("after other schedules")


# The field that carries each kind of trigger (keyed by ScheduleKind, or its plain str
# value): a schedule sets exactly one, and they are @job(...)'s trigger options.
KIND_FIELDS: dict[str, str] = {
    ScheduleKind.CRON: "cron",
    ScheduleKind.INTERVAL: "interval",
    ScheduleKind.ONCE: "run_at",
    ScheduleKind.RRULE: "rrule",
    ScheduleKind.AFTER: "after",
}
# Each of those fields as it is stored when it is not the schedule's trigger (its default):
# what a code-defined or imported schedule, or the admin's form, sets the other kinds' to.
UNSET_TRIGGER: dict[str, Any] = {
    "cron": "",
    "interval": None,
    "run_at": None,
    "rrule": "",
    "after": [],
}


class Overlap(models.TextChoices):
    SKIP = "skip", _("skip the new fire")
    QUEUE = "queue", _("queue the new fire")
    CONCURRENT = "concurrent", _("run concurrently")


class Misfire(models.TextChoices):
    LATEST = "latest", _("fire once for the latest missed time")
    ALL = "all", _("fire every missed time")
    SKIP = "skip", _("fire none of the missed times")


class AttentionReason(models.TextChoices):
    """Why a schedule needs attention (``Schedule.attention_reason``; empty: it is fine).
    The rules are models/alerting.py's."""

    NO_SUCCESS = "no_success", _("no success in time")
    FAILING = "failing", _("its last runs failed")
    LATE = "late", _("a run was late")
    # Written by the pass that plans runs after runs (engine/planning/after.py), not by the
    # alert rules: an upstream it names is missing or disabled, or they form a cycle.
    UPSTREAM = "upstream", _("an upstream schedule is missing or disabled")


class AfterOutcome(models.TextChoices):
    """What an upstream's run for a plan time must end in for a downstream schedule to
    fire for it (``Schedule.after_outcome``)."""

    SUCCEEDED = "succeeded", _("succeeded")
    FINISHED = "finished", _("finished, in any end state")


class DstGap(models.TextChoices):
    """A cron fire whose wall time a spring-forward change skips (empty: cron(8)'s rule)."""

    SKIP = "skip", _("skip it")
    FIRST_VALID = "first_valid", _("run at the first valid instant after the change")


class DstRepeat(models.TextChoices):
    """A cron fire whose wall time a fall-back change repeats (empty: cron(8)'s rule)."""

    ONCE = "once", _("run the first occurrence only")
    BOTH = "both", _("run both occurrences")


class OnClosedDay(models.TextChoices):
    """A fire on a day its schedule's calendars close (``Schedule.on_closed_day``)."""

    SKIP = "skip", _("skip it")
    NEXT_OPEN_DAY = "next_open_day", _("run it on the next open day, at its time of day")
    PREVIOUS_OPEN_DAY = (
        "previous_open_day",
        _("run it on the previous open day, at its time of day"),
    )


class OverrideAction(models.TextChoices):
    """What a single-fire override does to its fire (``FireOverride.action``)."""

    SKIP = "skip", _("skip it")
    MOVE = "move", _("run it at another time")


class LeaseOutcome(models.TextChoices):
    """How an execution attempt ended (empty while it holds the run)."""

    SUCCEEDED = "succeeded", _("succeeded")
    RETRY = "retry", _("failed, to be retried")
    FAILED = "failed", _("failed")
    RELEASED = "released", _("released at shutdown, to run again")
    INTERRUPTED = "interrupted", _("interrupted at shutdown")
    TIMEOUT = "timeout", _("timed out")
    CANCELLED = "cancelled", _("cancelled")
    SKIPPED = "skipped", _("skipped: claimed ahead, but too late to start")
    EXPIRED = "expired", _("expired: its process stopped heartbeating")


class ErrorCode(models.TextChoices):
    """Why the scheduler failed, skipped or ended a run (``Run.error_code``). A job that
    raised is recorded with a code of its own (its exception's), not one of these."""

    MISSED = "missed", _("skipped: missed, by its misfire policy")
    OVERLAP = "overlap", _("skipped: its schedule's previous run was still active")
    QUEUE_FULL = "queue_full", _("skipped: its schedule's queue was full")
    START_DEADLINE = "start_deadline", _("skipped: no worker could start it in time")
    PAUSED = "paused", _("skipped: its schedule was paused")
    CLOSED = "closed", _("skipped: a calendar closed its day")
    # Schedule.skip_fire(): an operator skipped this one fire (models/overrides.py).
    OVERRIDDEN = "overridden", _("skipped: an override skipped this fire")
    SUPERSEDED = "superseded", _("failed: a newer fire replaced its retry")
    UNKNOWN_JOB = "unknown_job", _("failed: its job is not registered")
    # Runs after runs (engine/planning/after.py): an upstream's run for the plan time ended
    # in a state that does not count (its error message names it), or was not done within
    # the downstream's after_wait.
    UPSTREAM_FAILED = "upstream_failed", _("skipped: an upstream run did not succeed")
    UPSTREAM_LATE = "upstream_late", _("skipped: an upstream run was not done in time")
    # No live process had its job before its start deadline (a rolling deploy that never
    # finished, or a job removed from the code): see engine/fleet.py.
    JOB_NOT_DEPLOYED = "job_not_deployed", _("skipped: no live process has its job")
    # Its schedule's concurrency limit (models/limits.py) had no free slot before its start
    # deadline: its error message names the limit.
    CONCURRENCY_LIMIT = "concurrency_limit", _("skipped: its concurrency limit stayed full")
    # Its lease cannot be taken: the database refused the claim, or its schedule's
    # lease_timeout would make the lease outlast every time a row may hold.
    CANNOT_CLAIM = "cannot_claim", _("failed: its lease could not be taken")
    # It is routed to a TASKS alias that the TASKS setting does not have.
    UNKNOWN_TASKS_BACKEND = "unknown_tasks_backend", _("failed: unknown tasks backend")
    # Its outcome (result or error) was refused by the database, even alone.
    OUTCOME_NOT_STORABLE = "outcome_not_storable", _("failed: its outcome could not be stored")
    LEASE_EXPIRED = "lease_expired", _("failed: its process stopped heartbeating")
    TIMEOUT = "timeout", _("failed: it ran past its timeout")
    CANCELLED = "cancelled", _("cancelled")
    INTERRUPTED = "interrupted", _("interrupted at shutdown")
