"""A schedule's streak of failed runs, as the ORM counts it for many schedules at once.

The failing rule (``alerting.failing``) reads how many runs of a schedule failed since its
last success: those with a plan time after the latest plan time of its succeeded runs (of
any trigger). ``pause_after_failures`` counts from its last save too (a resume, an edit),
so that a schedule resumed gets its threshold afresh. These are the expressions that count
them, one subquery per schedule row, read on the index on (schedule, -plan_time): the
attention pass (attention.py) annotates every schedule it judges with them, and the
outcome of a failed run (``self_pausing.pause_reached``) the schedules of its batch.
"""

from typing import Any

from django.db.models import Count, DateTimeField, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce

from django_periodic.choices import RunStatus
from django_periodic.models import Run
from django_periodic.timing import bounds


def last_success(using: str) -> Subquery:
    """The plan time of the latest succeeded run of the schedule (``OuterRef("pk")``), of
    any trigger; NULL: none."""
    runs = Run.objects.using(using).filter(schedule=OuterRef("pk"), status=RunStatus.SUCCEEDED)
    return Subquery(runs.order_by("-plan_time").values("plan_time")[:1])


def since_success(after: Any = None) -> Q:
    """The runs planned after the schedule's last success (annotated ``last_success``), and
    after ``after`` (an expression of the schedule's row) if given."""
    start = Coalesce(
        OuterRef("last_success"), Value(bounds.UNPLANNED, output_field=DateTimeField())
    )
    return Q(plan_time__gt=start) & (Q() if after is None else Q(plan_time__gt=after))


def failures(using: str, since: Q) -> Subquery:
    """How many runs of the schedule (``OuterRef("pk")``) that ``since`` selects failed:
    its failures in a row (``alerting.failing``); NULL: none."""
    runs = Run.objects.using(using).filter(since, schedule=OuterRef("pk"), status=RunStatus.FAILED)
    counted = runs.values("schedule").annotate(n=Count("pk")).values("n")
    return Subquery(counted, output_field=IntegerField())


def failures_since_saved(using: str) -> Subquery:
    """The failures in a row that ``pause_after_failures`` counts: since the schedule's last
    success (annotated ``last_success``) and its last save (``updated_at``)."""
    return failures(using, since_success(after=OuterRef("updated_at")))
