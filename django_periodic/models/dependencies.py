"""Runs after runs: the rules of a schedule's ``after`` (the names of its upstreams).

One home for them: ``Schedule.clean()`` (and so the admin's form) refuses a bad list, and
the planning pass (engine/planning/after.py) judges the rows stored past it, by the same
functions: a list of distinct names, none its own, each an existing schedule, no cycle.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db.models import Q

from django_periodic.choices import FINAL_STATUSES, AfterOutcome, RunStatus
from django_periodic.models.schedule_fields import ScheduleFields

# The downstream schedules (``after`` set): the planning pass reads these alone, by their
# index (periodic_schedule_downstream).
DOWNSTREAM = ~Q(after=[])


def counting_statuses(after_outcome: str) -> tuple[str, ...]:
    """The end states of an upstream's run that let its downstream fire, by its
    ``after_outcome`` (a value this release does not know: success alone)."""
    if after_outcome == AfterOutcome.FINISHED:
        return FINAL_STATUSES
    return (RunStatus.SUCCEEDED,)


def shape_error(after: Any, own_name: str) -> str | None:
    """Why ``after`` is not a list of distinct schedule names other than ``own_name``."""
    if not isinstance(after, list) or not all(isinstance(n, str) and n for n in after):
        return 'after must be a JSON list of schedule names, e.g. ["extract"].'
    if len(set(after)) != len(after):
        return "after names a schedule twice."
    if own_name in after:
        return "A schedule cannot run after itself."
    return None


def missing_error(missing: Iterable[str]) -> str:
    names = ", ".join(repr(name) for name in sorted(missing))
    return f"after names no existing schedule: {names}."


def cycle_error(cycle: Sequence[str]) -> str:
    return "after makes a cycle: " + " -> ".join(cycle) + "."


def cycle_through(name: str, edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The cycle through ``name`` in ``edges`` (a schedule's name: the names it runs
    after), as the path from ``name`` back to it; None if there is none."""
    path: list[str] = [name]
    seen: set[str] = set()

    def visit(node: str) -> bool:
        for upstream in edges.get(node, ()):
            if upstream == name:
                path.append(name)
                return True
            if upstream in seen:
                continue
            seen.add(upstream)
            path.append(upstream)
            if visit(upstream):
                return True
            path.pop()
        return False

    return path if visit(name) else None


def errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """(field, message) for each rule the ``after`` of ``schedule`` breaks (``clean()``):
    two queries, the names it runs after and every other downstream's."""
    after = schedule.after
    shape = shape_error(after, schedule.name)
    if shape:
        return [("after", shape)]
    if not after:
        return []
    found: list[tuple[str, str]] = []
    if schedule.scopes:
        message = "A schedule that runs after others takes their scope keys: leave scopes empty."
        found.append(("scopes", message))
    others = type(schedule)._default_manager.using(schedule._state.db or "default")
    others = others.exclude(pk=schedule.pk) if schedule.pk else others
    existing = set(others.filter(name__in=after).values_list("name", flat=True))
    if missing := set(after) - existing:
        return [*found, ("after", missing_error(missing))]
    edges = {n: a for n, a in others.filter(DOWNSTREAM).values_list("name", "after")}
    edges[schedule.name] = after
    edges = {n: a for n, a in edges.items() if isinstance(a, list)}
    cycle = cycle_through(schedule.name, edges)
    return [*found, ("after", cycle_error(cycle))] if cycle else found
