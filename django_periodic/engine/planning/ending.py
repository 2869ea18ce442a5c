"""Ending a schedule after its ``max_runs`` fires (docs/policies.md, "Lifecycle").

A schedule's ``fire_count`` counts its fires planned to run: the distinct plan times of a
decision recorded pending or queued (a fanned-out fire counts once, however many scopes;
a fire recorded skipped does not count, nor does a manual run or a backfill). The
backends add a decision's count in the statement that moves its cursor. A decision that
would reach ``max_runs`` is cut at the fire that reaches it: no fire after it is recorded
(a misfire ``all`` catch-up cannot overshoot) and the cursor becomes NULL, so the
schedule has no next fire until ``max_runs`` is raised or cleared (``Schedule.save()``).
"""

from dataclasses import replace

from django_periodic.choices import RunStatus
from django_periodic.engine.records import Decision, Fire
from django_periodic.models.lifecycle import runs_left


def counted(fires: tuple[Fire, ...]) -> int:
    """How many fires of a decision ``fire_count`` counts: its plan times that run."""
    return len({fire.plan_time for fire in fires if fire.status != RunStatus.SKIPPED})


def capped(decision: Decision) -> Decision:
    """The decision, cut at the fire that reaches its schedule's ``max_runs``."""
    schedule = decision.schedule
    left = runs_left(schedule.max_runs, schedule.fire_count)
    if left is None or decision.error:
        return decision
    if left == 0:  # ended already (max_runs lowered without save(), say): nothing fires
        return replace(decision, cursor=None, fires=(), supersedes=())
    running = sorted({f.plan_time for f in decision.fires if f.status != RunStatus.SKIPPED})
    if len(running) < left:
        return decision
    last = running[left - 1]
    fires = tuple(fire for fire in decision.fires if fire.plan_time <= last)
    return replace(decision, cursor=None, fires=fires)
