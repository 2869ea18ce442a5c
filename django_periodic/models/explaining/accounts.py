"""One fire's account: what became of it, in a word (``FireStatus``), with its code, the
details in words and the run that says so; and an account read off a fire's runs."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_periodic.choices import WAITING_STATUSES, ErrorCode, RunStatus
from django_periodic.models import limits


class FireStatus(models.TextChoices):
    """What became of a fire: a run's status, or why it has none. Not stored."""

    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    RUNNING = "running", _("running")
    PENDING = "pending", _("pending")
    QUEUED = "queued", _("queued")
    RETRYING = "retrying", _("retrying")
    CANCELLED = "cancelled", _("cancelled")
    SKIPPED = "skipped", _("skipped")  # by the scheduler: its code says why
    CLOSED = "closed", _("closed by a calendar")
    PAUSED = "paused", _("paused")
    OVERRIDDEN = "overridden", _("skipped by an override")
    MOVED = "moved", _("moved by an override, not run yet")
    MIXED = "mixed", _("fanned out: its scopes' runs differ")
    NOT_PLANNED_YET = "not_planned_yet", _("not planned yet")
    DISABLED = "disabled", _("not planned: the schedule is disabled")
    BEFORE_START = "before_start", _("before start_at")
    AFTER_END = "after_end", _("after end_at")
    AFTER_MAX_RUNS = "after_max_runs", _("after max_runs")
    BEFORE_CREATED = "before_created", _("before the schedule existed")
    BEFORE_CHANGE = "before_change", _("before its trigger last changed")
    NO_RECORD = "no_record", _("no record")


# What a skipped run's code makes of its fire: the reasons with a word of their own.
_SKIP_STATUS: dict[str, str] = {
    ErrorCode.CLOSED: FireStatus.CLOSED,
    ErrorCode.PAUSED: FireStatus.PAUSED,
    ErrorCode.OVERRIDDEN: FireStatus.OVERRIDDEN,
}


# A wait for a slot shorter than this is the admission's own pace, not a wait worth a word.
WORTH_SAYING = timedelta(seconds=1)


class RunRow(NamedTuple):
    """The columns of a run that an account reads (``RUN_FIELDS``, in order)."""

    pk: int
    plan_time: datetime
    scope: str
    status: str
    error_code: str
    error_message: str
    finish_by: datetime | None = None  # its deadline (Run.finish_by)
    late_at: datetime | None = None  # when it was found late
    finished_at: datetime | None = None
    release_at: datetime | None = None  # limits.HELD while it waits for its limit
    admitted_at: datetime | None = None  # when its limit gave it a slot
    limit_name: str | None = None  # its concurrency limit's (Run.concurrency_limit)

    @property
    def limit_note(self) -> str:
        """What it waits for, or waited for, in words: a slot of its concurrency limit."""
        name = f"its concurrency limit “{self.limit_name or '(deleted)'}”"
        if self.release_at == limits.HELD and self.status in WAITING_STATUSES:
            return f"Waiting for a slot of {name}."
        if self.admitted_at is None:
            return ""
        waited = self.admitted_at - (self.release_at or self.plan_time)
        if waited < WORTH_SAYING:
            return ""
        return f"Waited {_duration(waited)} for a slot of {name}."

    def late_by(self, now: datetime) -> timedelta | None:
        """How far past its deadline it finished, or is at ``now`` unfinished; None: it
        was not late."""
        if self.late_at is None or self.finish_by is None:
            return None
        return max((self.finished_at or now) - self.finish_by, timedelta(0))


# Read as values_list(*RUN_FIELDS): RunRow's fields, the limit's name through its key.
RUN_FIELDS = tuple(
    "concurrency_limit__name" if name == "limit_name" else name for name in RunRow._fields
)


@dataclass(frozen=True)
class FireAccount:
    """What became of one fire of a schedule's trigger.

    ``status`` is a ``FireStatus``; ``code`` the run's error code (a ``choices.ErrorCode``,
    or a job's exception's), ``detail`` the rest in words; ``run_id`` the run that says so
    (None: no run, or several scopes' runs, counted in ``scopes`` by status).
    """

    plan_time: datetime
    status: str
    code: str = ""
    detail: str = ""
    run_id: int | None = None
    scope: str = ""
    scopes: dict[str, int] = field(default_factory=dict)
    # How far its run went past its deadline (``finish_within``); None: it was not late.
    late_by: timedelta | None = None

    def as_dict(self) -> dict[str, Any]:
        """The account as JSON values (the time in ISO 8601, UTC)."""
        return {
            "plan_time": self.plan_time.isoformat(),
            "status": str(self.status),
            "code": str(self.code),
            "detail": self.detail,
            "run_id": self.run_id,
            "scope": self.scope,
            "scopes": dict(self.scopes),
            "late_by": None if self.late_by is None else self.late_by.total_seconds(),
        }


def status_of_run(run: RunRow) -> str:
    """A run's outcome as a fire's: its status, or a skip's own word by its code."""
    if run.status == RunStatus.SKIPPED:
        return _SKIP_STATUS.get(run.error_code, FireStatus.SKIPPED)
    return str(run.status)


def from_runs(
    plan_time: datetime, runs: Sequence[RunRow], now: datetime, note: str = ""
) -> FireAccount:
    """The account of a fire recorded by ``runs`` (one per scope on a fanned-out schedule):
    one run's own, or, for several, their statuses counted (``MIXED`` when they differ);
    with how late the latest of them was, at ``now``, if any was."""
    lates = [by for run in runs if (by := run.late_by(now)) is not None]
    late_by = max(lates, default=None)
    late = f"Late by {_duration(late_by)}." if late_by is not None else ""
    if len(runs) == 1:
        (run,) = runs
        detail = _joined(note, run.error_message, run.limit_note, late)
        status = status_of_run(run)
        return FireAccount(
            plan_time, status, run.error_code, detail, run.pk, run.scope, {}, late_by
        )
    counts = Counter(status_of_run(run) for run in runs)
    status = next(iter(counts)) if len(counts) == 1 else FireStatus.MIXED
    shown = ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))
    detail = _joined(note, f"{len(runs)} scopes: {shown}.", late)
    return FireAccount(plan_time, status, detail=detail, scopes=dict(counts), late_by=late_by)


def _duration(value: timedelta) -> str:
    """A lateness in words, to the second: "1:02:03" reads badly in a sentence."""
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "min"), (seconds, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n) or "under a second"


def _joined(*parts: str) -> str:
    return " ".join(part for part in parts if part)
