"""Which schedules need attention: judged for all of them at once, each change written by
compare-and-set and announced once.

One query gathers the facts of every schedule with alerts (and of every schedule stored as
needing attention), read on their index (``alerting.JUDGED``): the schedules with none cost
it nothing, so an app without alerts pays one cheap statement, however many schedules it
has; ``models.alerting`` decides from them in Python. The schedules whose
verdict differs from their stored state are then locked, skipping rows another process
holds (a planner, or another scheduler judging at the same time), and read again: a row
whose stored state is no longer the one judged from is left to the next evaluation. One
UPDATE per new state follows (at most three), and the signals of the changes are sent once
the transaction commits. However many scheduler processes judge, each change is written by
one of them and announced by that one only. Four queries at most, however many schedules;
the same facts say which schedules pause themselves for their failures (self_pausing.py,
three more at most, only when one does).
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import (
    BooleanField,
    Case,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from django_periodic import signals
from django_periodic.choices import AttentionReason, RunStatus, RunTrigger
from django_periodic.db import announcements
from django_periodic.engine.planning import self_pausing, streaks
from django_periodic.models import Run, Schedule, alerting

logger = logging.getLogger("django_periodic")

# A schedule's facts as _facts() reads them.
Row = dict[str, Any]

FACT_FIELDS = ("pk", "name", "alert_after", "alert_failures", "finish_within", "attention_reason")


@dataclass(frozen=True)
class Change:
    """One schedule's state changing: ``reason`` new ("" when it recovered), ``previous``
    what it was."""

    schedule_id: int
    schedule: str
    reason: str
    previous: str
    message: str
    # When it began to need attention: now for a change that begins it.
    since: datetime

    @property
    def began(self) -> bool:
        return not self.previous

    @property
    def ended(self) -> bool:
        return not self.reason


@dataclass
class Evaluation:
    """What one evaluation found: schedules with alerts, and the changes it wrote."""

    watched: int = 0
    changes: list[Change] = field(default_factory=list)
    paused: list[self_pausing.Paused] = field(default_factory=list)  # for their failures


def evaluate(now: datetime, using: str = "default") -> Evaluation:
    """Judge every schedule at ``now`` (the database's clock) and write what changed; and
    pause those that keep failing (``self_pausing``), judged from the same facts."""
    rows = _facts(now, using)
    found = Evaluation(watched=sum(1 for row in rows if row["watched"] or row["self_pausing"]))
    found.paused = self_pausing.pause_failing(rows, now, using)
    judged: dict[int, tuple[Row, str]] = {}
    for row in rows:
        verdict = _verdict(row, now)
        if verdict is not None and verdict != row["attention_reason"]:
            judged[row["pk"]] = (row, verdict)
    if judged:
        found.changes = _write(judged, now, using)
    return found


def _verdict(row: Row, now: datetime) -> str | None:
    """The row's reason at ``now``; None for a row that cannot be judged (logged; its
    state stays until it can)."""
    if row["attention_reason"] == AttentionReason.UPSTREAM:
        return None  # the pass planning runs after runs judges it (after.py)
    if not row["watched"]:
        return ""  # disabled, or its alerts removed: nothing is expected of it
    try:
        facts = alerting.Facts(
            alert_after=row["alert_after"],
            alert_failures=row["alert_failures"],
            oldest_unsucceeded=row["oldest_unsucceeded"],
            failures=row["failures"] or 0,
            late=bool(row["late"]),
        )
        return alerting.reason(facts, now)
    except (ArithmeticError, TypeError, ValueError) as exc:
        logger.error("Cannot judge the alerts of schedule %r: %s", row["name"], exc)
        return None


def _facts(now: datetime, using: str) -> list[Row]:
    """Every schedule with alerts, stored as needing attention, or that may pause itself,
    with the facts the rules read. One query; each subquery reads one schedule's runs by
    the index on (schedule, -plan_time), newest first, from its last success on."""
    runs = Run.objects.using(using).filter(schedule=OuterRef("pk"))
    fires = runs.filter(streaks.since_success(), trigger=RunTrigger.SCHEDULE).exclude(
        status=RunStatus.SKIPPED, error_code__in=alerting.NOT_EXPECTED
    )
    schedules = Schedule.objects.using(using).readable()
    pausing = self_pausing.watched(now)
    candidates = schedules.with_alerts() | schedules.needing_attention() | schedules.filter(pausing)
    # Each of them is in the index's condition: stated, the database reads that index alone.
    candidates = candidates.filter(alerting.JUDGED)
    return list(
        candidates.annotate(last_success=streaks.last_success(using))
        .annotate(
            oldest_unsucceeded=Subquery(fires.order_by("plan_time").values("plan_time")[:1]),
            failures=streaks.failures(using, streaks.since_success()),
            late=Exists(runs.filter(streaks.since_success(), late_at__isnull=False)),
            watched=ExpressionWrapper(alerting.WITH_ALERTS, output_field=BooleanField()),
            self_pausing=ExpressionWrapper(pausing, output_field=BooleanField()),
            # A self-pausing schedule counts from its last save too (streaks.py).
            failures_since_saved=Case(When(pausing, then=streaks.failures_since_saved(using))),
        )
        .values(
            *FACT_FIELDS,
            *self_pausing.FACT_FIELDS,
            "oldest_unsucceeded",
            "failures",
            "late",
            "watched",
            "self_pausing",
            "failures_since_saved",
        )
    )


def _write(judged: dict[int, tuple[Row, str]], now: datetime, using: str) -> list[Change]:
    """Write each verdict whose row still holds the state it was judged from; return the
    changes written, announced once the transaction commits."""
    schedules = Schedule.objects.using(using)
    changes = []
    with transaction.atomic(using=using):
        locked = schedules.select_for_update(skip_locked=True).filter(pk__in=judged)
        by_reason: dict[str, list[int]] = defaultdict(list)
        for pk, stored, since in locked.values_list("pk", "attention_reason", "attention_since"):
            row, reason = judged[pk]
            if stored != row["attention_reason"]:
                continue  # changed since it was read: judged again next time
            by_reason[reason].append(pk)
            changes.append(_change(row, reason, since or now))
        for reason, pks in by_reason.items():
            # A change of reason keeps the time it began to need attention.
            began = Coalesce(F("attention_since"), Value(now)) if reason else Value(None)
            schedules.filter(pk__in=pks).update(attention_reason=reason, attention_since=began)
        announcements.send_on_commit(_events(changes, using), using)
    for change in changes:
        _log(change)
    return changes


def _change(row: Row, reason: str, since: datetime) -> Change:
    previous = str(row["attention_reason"])
    shown = reason or previous
    message = alerting.note(shown, row["alert_after"], row["alert_failures"], row["finish_within"])
    return Change(row["pk"], row["name"], reason, previous, message, since)


def _events(changes: list[Change], using: str) -> list[signals.Event]:
    """The signal of each change that begins or ends a need for attention (a change of
    reason while it needs attention is written, not announced)."""
    events = []
    for change in changes:
        if not (change.began or change.ended):
            continue
        signal = signals.schedule_recovered if change.ended else signals.schedule_needs_attention
        arguments = {
            "schedule_id": change.schedule_id,
            "schedule": change.schedule,
            "reason": change.reason or change.previous,
            "message": change.message,
            "since": change.since,
            "using": using,
        }
        events.append((signal, arguments))
    return events


def _log(change: Change) -> None:
    name, message = change.schedule, change.message
    if change.began:
        logger.warning("Schedule %r needs attention: %s.", name, message)
    elif change.ended:
        logger.info("Schedule %r recovered (it needed attention: %s).", name, message)
    else:
        logger.warning("Schedule %r still needs attention: %s.", name, message)
