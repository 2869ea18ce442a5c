"""Runs after runs: a downstream schedule's runs, derived from its upstreams' runs.

A downstream schedule (``Schedule.after`` names its upstreams) has no clock and no cursor
(``next_fire_at`` stays NULL, so the clock's planning never finds it due). Its runs are
derived from durable state alone, the upstreams' ledger rows: for each plan time T (and
scope key) that an upstream has a run for, once every upstream's run for T has ended in
what ``after_outcome`` asks, the downstream gets a run for T; once one has ended otherwise,
or ``after_wait`` from T has passed first, it gets a skipped run for T whose code and
message name that upstream. Either is inserted keyed by (schedule, scope, plan time), as
every ledger run is, and a conflict does nothing: two passes, two processes, or a pass
after a crash record T once. Nothing is remembered in between but those rows.

Which plan times are looked at: from the downstream's ``start_at`` (else its creation)
and from ``after_wait`` before its newest run's plan time, when every older plan time had
been decided by the pass that recorded that run.

One pass costs a constant number of statements, however many schedules: the enabled
downstream schedules (on their own index: a schedule on a clock costs nothing), the
upstreams they name, the runs of both since the oldest plan time looked at, then one
INSERT; and one UPDATE per downstream whose state changed. A downstream whose ``after``
is unusable (a cycle, a schedule that does not exist, a value stored past ``clean()``)
fails alone, as a bad row does in the planner (``recording.record_failure``); one whose
upstream is missing or disabled says so on its row (``last_error``, ``attention_reason``).
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import F, Max, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce

from django_periodic import policies, signals
from django_periodic.choices import (
    FINAL_STATUSES,
    LEDGER_TRIGGERS,
    AttentionReason,
    ErrorCode,
    RunStatus,
    RunTrigger,
)
from django_periodic.db import announcements
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import recording
from django_periodic.engine.records import Due
from django_periodic.escaping import escaped
from django_periodic.models import Run, Schedule, limits, trigger_rows
from django_periodic.models.run import taken_from_schedule
from django_periodic.timing import bounds

logger = logging.getLogger("django_periodic")

# While an upstream's run for a plan time is in flight, its end is looked for this often
# (and at once on a wake-up: a planning pass, a NOTIFY).
POLL = timedelta(seconds=1)

FIELDS = (
    "pk", "name", "job", "args", "kwargs", "revision", "max_attempts", "tasks_backend",
    "overlap", "misfire_grace", "after", "after_outcome", "after_wait", "start_at", "end_at",
    "created_at", "paused_until", "planning_failures", "last_error", "attention_reason",
    "finish_within", "concurrency_limit_id",
)  # fmt: skip

# (scope, plan time) of a run
Key = tuple[str, datetime]


@dataclass(frozen=True)
class Downstream:
    """A downstream schedule's row as the pass reads it (a ``run.NewRunSource``)."""

    pk: int
    name: str
    job: str
    args: Any
    kwargs: Any
    revision: int
    max_attempts: int
    tasks_backend: str
    overlap: str
    misfire_grace: timedelta
    after: Any
    after_outcome: str
    after_wait: timedelta
    start_at: datetime | None
    end_at: datetime | None
    created_at: datetime
    paused_until: datetime | None
    planning_failures: int
    last_error: str
    attention_reason: str
    finish_within: timedelta | None
    concurrency_limit_id: int | None
    newest: datetime | None  # the plan time of its newest ledger run

    @property
    def floor(self) -> datetime:
        """Its plan times from here on are looked at (see the module's docstring)."""
        floor = self.start_at or self.created_at
        if self.newest is not None:
            floor = max(floor, policies.shifted(self.newest, -self.after_wait))
        return floor


class Upstream(NamedTuple):
    """What the pass reads of a schedule a downstream names."""

    pk: int
    enabled: bool
    after: Any


@dataclass
class AfterResult:
    """What one pass recorded, and when the next is due (None: on news alone)."""

    fired: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    next_check: datetime | None = None


@dataclass(frozen=True)
class _Verdict:
    status: str  # pending, or skipped with a code
    code: str = ""
    message: str = ""


def plan_after(now: datetime, using: str = "default") -> AfterResult:
    """Record the runs (or skipped runs) of every downstream schedule whose upstreams'
    runs for a plan time have decided it at ``now`` (the database's clock)."""
    result = AfterResult()
    downstreams = _downstreams(using)
    if not downstreams:
        return result
    named = {name for d in downstreams if _names(d.after) for name in d.after}
    rows = Schedule.objects.using(using).filter(name__in=named)
    upstreams = {
        name: Upstream(pk, enabled, after)
        for pk, name, enabled, after in rows.values_list("pk", "name", "enabled", "after")
    }
    edges = {name: row.after for name, row in upstreams.items() if _names(row.after)}
    edges.update({d.name: d.after for d in downstreams if _names(d.after)})
    plannable = []
    for downstream in downstreams:
        problems = _problems(downstream, upstreams, edges)
        _say(downstream, problems, now, using)
        if problems[0]:
            result.failed.append(downstream.name)
        else:
            plannable.append(downstream)
    if plannable:
        _plan(plannable, upstreams, now, using, result)
    return result


def _downstreams(using: str) -> list[Downstream]:
    """The enabled downstream schedules, each with its newest ledger run's plan time."""
    runs = Run.objects.using(using).filter(schedule_id=OuterRef("pk"), trigger__in=LEDGER_TRIGGERS)
    newest = runs.values("schedule_id").annotate(newest=Max("plan_time")).values("newest")
    enabled = Schedule.objects.using(using).downstream().enabled()
    rows = enabled.annotate(newest=Subquery(newest)).values_list(*FIELDS, "newest")
    return [Downstream(*row) for row in rows]


def _names(after: Any) -> bool:
    return isinstance(after, list) and all(isinstance(name, str) for name in after)


def _problems(
    downstream: Downstream, upstreams: dict[str, "Upstream"], edges: dict[str, Any]
) -> tuple[str, str]:
    """(why it cannot be planned, what it should say while it is planned); "" if none."""
    shape = trigger_rows.shape_error(downstream.after, downstream.name)
    if shape:
        return f"Cannot plan: {shape}", ""
    if downstream.finish_within is not None:
        # Stored past its CHECK: its runs could have no deadline (policies.finish_by).
        out_of_range = bounds.SCHEDULE["finish_within"].error(
            "finish_within", downstream.finish_within
        )
        if out_of_range:
            return f"Cannot plan: {out_of_range}", ""
    missing = [name for name in downstream.after if name not in upstreams]
    if missing:
        return f"Cannot plan: {trigger_rows.missing_error(missing)}", ""
    cycle = trigger_rows.cycle_through(downstream.name, edges)
    if cycle:
        return f"Cannot plan: {trigger_rows.cycle_error(cycle)}", ""
    disabled = [name for name in downstream.after if not upstreams[name].enabled]
    if disabled:
        names = ", ".join(repr(name) for name in disabled)
        return "", f"It runs after {names}, which is disabled: it waits for no run of it."
    return "", ""


def _say(downstream: Downstream, problems: tuple[str, str], now: datetime, using: str) -> None:
    """Write what is wrong with it (or that nothing is any more) where users look: its
    ``last_error`` and the attention list; a failure counts as the planner's do."""
    failure, notice = problems
    upstream = AttentionReason.UPSTREAM
    if failure:
        recording.record_failure(_as_due(downstream), failure, using)
    message = failure or notice
    stored = (downstream.attention_reason, downstream.last_error)
    if message and stored != (upstream, message):
        since = Coalesce(F("attention_since"), Value(now))
        _write_state(
            downstream, using, attention_reason=upstream, attention_since=since, last_error=message
        )
        if not failure:
            logger.warning("Schedule %r needs attention: %s", downstream.name, escaped(message))
    elif not message and downstream.attention_reason == upstream:
        _write_state(
            downstream, using, attention_reason="", attention_since=None, last_error="",
            planning_failures=0,
        )  # fmt: skip


def _write_state(downstream: Downstream, using: str, **values: Any) -> None:
    """Compare-and-set on the state the pass read: of two passes, one writes it."""
    rows = Schedule.objects.using(using).filter(pk=downstream.pk)
    rows.filter(attention_reason=downstream.attention_reason).update(**values)


def _as_due(downstream: Downstream) -> Due:
    """What recording a planning failure reads of a schedule."""
    return Due(
        pk=downstream.pk, name=downstream.name, job=downstream.job, cron="", timezone="",
        interval=None, run_at=None, start_at=None, end_at=None, created_at=None,
        next_fire_at=None, overlap="", max_queued=0, max_concurrent=None, misfire="",
        misfire_grace=timedelta(0), planning_failures=downstream.planning_failures, scopes="",
    )  # fmt: skip


def _plan(
    downstreams: list[Downstream],
    upstreams: dict[str, "Upstream"],
    now: datetime,
    using: str,
    result: AfterResult,
) -> None:
    """Decide every open plan time of these downstreams from one read of the runs, and
    insert what is decided in one statement."""
    floor = min(d.floor for d in downstreams)
    ids = {upstreams[name].pk for d in downstreams for name in d.after}
    ids |= {d.pk for d in downstreams}
    statuses: dict[int, dict[Key, str]] = defaultdict(dict)
    runs = Run.objects.using(using).filter(
        schedule_id__in=ids, trigger__in=LEDGER_TRIGGERS, plan_time__gte=floor
    )
    for schedule_id, scope, plan_time, status in runs.values_list(
        "schedule_id", "scope", "plan_time", "status"
    ):
        statuses[schedule_id][scope, plan_time] = status
    new_runs = []
    waits: list[datetime] = []
    for downstream in downstreams:
        ups = [(name, statuses[upstreams[name].pk]) for name in downstream.after]
        recorded = statuses[downstream.pk]
        keys = {key for _, runs_of in ups for key in runs_of if _open(downstream, key, recorded)}
        for scope, plan_time in sorted(keys, key=lambda key: key[1]):
            verdict = _verdict(downstream, ups, (scope, plan_time), now)
            if isinstance(verdict, datetime):
                waits.append(verdict)
                continue
            new_runs.append(_run(downstream, scope, plan_time, verdict, now))
    if new_runs:
        _insert(new_runs, {d.pk: d.name for d in downstreams}, using, result)
    result.next_check = min(waits, default=None)


def _insert(runs: list[Run], names: dict[int, str], using: str, result: AfterResult) -> None:
    """Insert the decided runs but those another process recorded first, count them and
    announce them (``run_planned``, ``run_skipped``) once committed."""
    inserted = ledger(using).insert_new_runs(runs)
    result.skipped = sum(status == RunStatus.SKIPPED for *_, status, _code in inserted)
    result.fired = len(inserted) - result.skipped
    if result.fired:
        announcements.notify(using)  # workers claim them at once
    if inserted and signals.listened(signals.run_planned, signals.run_skipped):
        announcements.send_on_commit(recording.planned_events(inserted, names, using), using)


def _open(downstream: Downstream, key: Key, recorded: dict[Key, str]) -> bool:
    """A plan time the downstream has no run for, within its bounds."""
    plan_time = key[1]
    if key in recorded or plan_time < downstream.floor:
        return False
    return downstream.end_at is None or plan_time < downstream.end_at


def _verdict(
    downstream: Downstream,
    upstreams: list[tuple[str, dict[Key, str]]],
    key: Key,
    now: datetime,
) -> _Verdict | datetime:
    """What becomes of one plan time: a run, a skipped run; or when to look again."""
    plan_time = key[1]
    if downstream.paused_until is not None and plan_time < downstream.paused_until:
        return _Verdict(RunStatus.SKIPPED, ErrorCode.PAUSED, "Its schedule was paused.")
    counts = trigger_rows.counting_statuses(downstream.after_outcome)
    in_flight = False
    late = ""
    for name, runs_of in upstreams:
        status = runs_of.get(key)
        if status is not None and status not in FINAL_STATUSES:
            in_flight = True
        if status in counts:
            continue
        if status in FINAL_STATUSES:
            message = f"Upstream {name!r} ended {status} for this plan time."
            return _Verdict(RunStatus.SKIPPED, ErrorCode.UPSTREAM_FAILED, message)
        late = late or name
    if not late:
        return _Verdict(RunStatus.PENDING)
    deadline = policies.shifted(plan_time, downstream.after_wait)
    if now >= deadline:
        shown = bounds.show(downstream.after_wait)
        message = f"Upstream {late!r} was not done within {shown} (after_wait)."
        return _Verdict(RunStatus.SKIPPED, ErrorCode.UPSTREAM_LATE, message)
    return min(deadline, now + POLL) if in_flight else deadline


def _run(
    downstream: Downstream, scope: str, plan_time: datetime, verdict: _Verdict, now: datetime
) -> Run:
    """The row of one decided plan time: pending from now (its start deadline counted from
    now, as a late fire's is), or skipped. It holds no overlap slot, as a backfilled run
    does not: each plan time runs once, whatever the others do."""
    fields = {**taken_from_schedule(downstream), "exclusive": False}
    if verdict.status == RunStatus.PENDING:
        deadline = policies.start_deadline(downstream.misfire_grace, now, now)
        return Run(
            schedule_id=downstream.pk, plan_time=plan_time, scope=scope,
            trigger=RunTrigger.SCHEDULE, start_deadline=deadline,
            finish_by=policies.finish_by(plan_time, downstream.finish_within),
            **limits.hold({**fields, "status": RunStatus.PENDING, "release_at": now}),
        )  # fmt: skip
    return Run(
        schedule_id=downstream.pk, plan_time=plan_time, scope=scope,
        trigger=RunTrigger.SCHEDULE, status=verdict.status, finished_at=now,
        error_code=verdict.code, error_message=verdict.message, **fields,
    )  # fmt: skip
