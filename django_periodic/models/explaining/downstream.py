"""``explain()`` of a schedule that fires after others (``after``): its fires are its
upstreams' plan times, not a trigger's.

Each plan time in the window that an upstream ran for, or that the schedule has a run for,
gets one account: its run's (run, or skipped with the upstream that failed or was late),
or, with no run yet, what it waits for and until when. Four queries (the clock's
included), whatever the window.
"""

from collections import defaultdict
from datetime import datetime

from django_periodic import choices, policies
from django_periodic.choices import RunStatus
from django_periodic.db import clock
from django_periodic.models import trigger_rows
from django_periodic.models.explaining.accounts import (
    RUN_FIELDS,
    FireAccount,
    FireStatus,
    RunRow,
    from_runs,
)
from django_periodic.models.explaining.pages import MAX_FIRES
from django_periodic.models.schedule_fields import ScheduleFields
from django_periodic.timing import bounds

RAN_AFTER = "It ran after its upstreams' runs for this plan time."


def accounts(
    schedule: ScheduleFields, since: datetime, until: datetime, scope: str | None
) -> list[FireAccount]:
    """The accounts of a downstream schedule's plan times in ``[since, until)``."""
    using = schedule._state.db or "default"
    names = [name for name in schedule.after if isinstance(name, str)]
    others = type(schedule)._default_manager.using(using)
    upstreams = dict(others.filter(name__in=names).values_list("pk", "name"))
    ledger = {"trigger__in": choices.LEDGER_TRIGGERS, "plan_time__gte": since}
    window = {**ledger, "plan_time__lt": until, **({} if scope is None else {"scope": scope})}
    runs_model = schedule.runs.model._default_manager.using(using)
    own: dict[datetime, list[RunRow]] = defaultdict(list)
    for row in schedule.runs.using(using).filter(**window).values_list(*RUN_FIELDS):
        run = RunRow(*row)
        own[run.plan_time].append(run)
    done: dict[datetime, set[str]] = defaultdict(set)
    counts = trigger_rows.counting_statuses(schedule.after_outcome)
    ran = runs_model.filter(schedule_id__in=upstreams, **window)
    for schedule_id, plan_time, status in ran.values_list("schedule_id", "plan_time", "status"):
        done.setdefault(plan_time, set())
        if status in counts:
            done[plan_time].add(upstreams[schedule_id])
    plan_times = sorted({*own, *done})
    if len(plan_times) > MAX_FIRES:
        raise ValueError(f"The window holds more than {MAX_FIRES:,} fires: narrow it.")
    now = clock.now(using)  # how late a run was, if it had a deadline
    return [
        from_runs(t, own[t], now, RAN_AFTER if own[t][0].status != RunStatus.SKIPPED else "")
        if t in own
        else _waiting(schedule, t, [n for n in names if n not in done[t]])
        for t in plan_times
    ]


def _waiting(schedule: ScheduleFields, plan_time: datetime, waits_for: list[str]) -> FireAccount:
    deadline = policies.shifted(plan_time, schedule.after_wait)
    shown = ", ".join(repr(name) for name in waits_for) or "its next planning pass"
    detail = f"Waits for {shown}, until {bounds.show(deadline)} (after_wait)."
    return FireAccount(plan_time, FireStatus.NOT_PLANNED_YET, detail=detail)
