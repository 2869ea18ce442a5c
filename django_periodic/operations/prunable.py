"""The retention rules (docs/retention.md), and how a pass finds the finished runs they do not
keep without reading every schedule.

A finished run is kept while any rule keeps it: it is one of the last ``keep_runs`` finished
runs of its schedule, or was planned within ``keep_runs_for``, or failed and was planned
within ``keep_failed_runs_for``. Each rule is the schedule's own field, else the setting of
the same name in capitals (``Rules``). A schedule with neither a count nor an age rule keeps
everything.

The schedules fall into a few *groups*, one per combination of their own retention fields:
one statement reads the distinct combinations of the schedules with a rule of their own, on
their index (``OWN_RETENTION``); the schedules that follow the settings are one group more,
never read. Then:

- The groups kept by age alone let their runs go by plan time: the runs of all of them are
  found in one set, bounded by plan time, read on the index on it.
- A group with a count rule keeps each schedule's N newest finished runs, and the plan time
  of its N-th newest is read on its history index. A *walk* reads it for every schedule of
  the group, in one statement, and keeps those with an older run to delete. Given a
  ``Mark`` of an earlier look, a pass reads only the schedules whose runs changed since:
  one of them finished, or passed an age rule. One statement finds them, on the primary key
  and the index on plan time, and finds none while nothing runs.

Active runs are never deleted, nor anything planning needs: the schedule's cursor
(``next_fire_at``), not its history, keeps a plan time from firing twice.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Max, Min, OuterRef, Q, Subquery

from django_periodic.conf import get_settings
from django_periodic.models import Run, RunQuerySet, Schedule
from django_periodic.models.schedule_fields import OWN_RETENTION, RETENTION_FIELDS

# Schedules whose runs one statement selects, and whose N-th newest runs one statement reads
# in a pass that looks at the changes since a mark.
SCHEDULE_BATCH = 100


@dataclass(frozen=True)
class Rules:
    """How long finished runs are kept (None: no such rule)."""

    keep_runs: int | None = None
    keep_runs_for: timedelta | None = None
    keep_failed_runs_for: timedelta | None = None

    @classmethod
    def from_settings(cls) -> "Rules":
        """The global rules: the ``KEEP_*`` settings."""
        settings = get_settings()
        return cls(settings.KEEP_RUNS, settings.KEEP_RUNS_FOR, settings.KEEP_FAILED_RUNS_FOR)

    def overridden_by(
        self,
        keep_runs: int | None,
        keep_runs_for: timedelta | None,
        keep_failed_runs_for: timedelta | None,
    ) -> "Rules":
        """These rules with a schedule's own fields (``RETENTION_FIELDS``) where set."""
        return Rules(
            self.keep_runs if keep_runs is None else keep_runs,
            self.keep_runs_for if keep_runs_for is None else keep_runs_for,
            self.keep_failed_runs_for if keep_failed_runs_for is None else keep_failed_runs_for,
        )

    @property
    def limited(self) -> bool:
        """Whether runs may be deleted at all: a count or an age rule is set."""
        return self.keep_runs is not None or self.keep_runs_for is not None


@dataclass(frozen=True)
class Cutoffs:
    """A schedule's finished runs planned before ``before`` may go; failed ones only if
    planned before ``failed_before`` too."""

    before: datetime
    failed_before: datetime


def cutoffs(rules: Rules, now: datetime, nth_newest: datetime | None) -> Cutoffs | None:
    """A schedule's cutoffs under ``rules``; None if it keeps every run.

    ``nth_newest`` is the plan time of its ``keep_runs``-th newest finished run (None if it
    has fewer). Runs planned at that time are kept: at least ``keep_runs`` remain.
    """
    if not rules.limited:
        return None
    bounds = []
    if rules.keep_runs is not None:
        if nth_newest is None:
            return None
        bounds.append(nth_newest)
    if rules.keep_runs_for is not None:
        bounds.append(now - rules.keep_runs_for)
    before = min(bounds)
    failed_before = before
    if rules.keep_failed_runs_for is not None:
        failed_before = min(before, now - rules.keep_failed_runs_for)
    return Cutoffs(before, failed_before)


@dataclass(frozen=True)
class Group:
    """The schedules whose own retention fields hold these values (None: unset, so the
    setting applies)."""

    keep_runs: int | None = None
    keep_runs_for: timedelta | None = None
    keep_failed_runs_for: timedelta | None = None

    def rules(self, settings: Rules) -> Rules:
        """The rules its schedules follow: its own fields where set, else ``settings``."""
        return settings.overridden_by(self.keep_runs, self.keep_runs_for, self.keep_failed_runs_for)

    def members(self, through: str = "") -> Q:
        """Its schedules; ``through`` a relation to them, "schedule__" for their runs."""
        lookups: dict[str, object] = {}
        for field in RETENTION_FIELDS:
            value = getattr(self, field)
            lookups.update(
                {f"{through}{field}__isnull": True} if value is None else {through + field: value}
            )
        return Q(**lookups)


# A group of schedules and the rules its schedules follow.
Ruled = tuple[Group, Rules]


@dataclass(frozen=True)
class Mark:
    """What a pass had seen when it looked: the database's time, and the lowest id of a run
    that could finish after (the oldest run active then, else the next one created)."""

    at: datetime
    runs_from: int


def mark(now: datetime, using: str) -> Mark:
    """The mark of a look at ``now``: one statement, two with no run active."""
    runs = Run.objects.using(using)
    # min() of the primary key would walk it from the oldest run through the whole history
    # to the first active one; of "pk + 0", it reads the active runs on their own index.
    oldest = runs.active().aggregate(oldest=Min(F("pk") + 0))["oldest"]
    if oldest is None:
        oldest = (runs.aggregate(newest=Max("pk"))["newest"] or 0) + 1
    return Mark(now, oldest)


def groups(rules: Rules, using: str) -> list[Ruled]:
    """Each group of schedules with the rules it follows, but those that keep every run.

    One statement reads the distinct own rules of the schedules that have some, on their
    index: a few rows, however many schedules share them. The schedules that follow the
    settings are a group of their own, never read.
    """
    own = Schedule.objects.using(using).filter(OWN_RETENTION).values_list(*RETENTION_FIELDS)
    found = [Group(), *(Group(*row) for row in own.order_by().distinct())]
    return [(group, group.rules(rules)) for group in found if group.rules(rules).limited]


def by_age(now: datetime, found: list[Ruled], using: str) -> RunQuerySet | None:
    """The finished runs that the groups kept by age alone let go, in one set (None: no
    such group). Each group's are bounded by plan time, read on the index on it."""
    condition, latest = Q(), None
    for group, rules in found:
        cut = cutoffs(rules, now, None) if rules.keep_runs is None else None
        if cut is not None:
            condition |= group.members("schedule__") & _older(cut)
            latest = max(latest or cut.before, cut.before)
    if latest is None:
        return None
    # The latest cutoff on its own too: the runs are read by plan time, then their
    # schedules, never every schedule to find its runs.
    return Run.objects.using(using).finished().filter(condition, plan_time__lt=latest)


def _older(cut: Cutoffs) -> Q:
    """The runs that ``cut`` lets go."""
    older = Q(plan_time__lt=cut.before)
    if cut.failed_before < cut.before:
        older &= ~Q(status=Run.Status.FAILED) | Q(plan_time__lt=cut.failed_before)
    return older


def by_count(
    now: datetime, found: list[Ruled], using: str, since: Mark | None = None
) -> Iterator[dict[int, Cutoffs]]:
    """The cutoffs of the schedules of the groups with a count rule that have runs to
    delete, a batch of schedules at a time.

    Without ``since``, a walk: every schedule of each group is read, in one statement per
    group. With it, only those whose runs changed since that mark (one statement; none found
    while idle), then one statement per group and batch of them.
    """
    counted = [(group, rules) for group, rules in found if rules.keep_runs is not None]
    if not counted:
        return
    if since is None:
        for group, rules in counted:
            found_here = list(_with_runs_to_delete(group, rules, now, using).items())
            for start in range(0, len(found_here), SCHEDULE_BATCH):
                yield dict(found_here[start : start + SCHEDULE_BATCH])
        return
    changed = _changed_since(since, now, counted, using)
    for start in range(0, len(changed), SCHEDULE_BATCH):
        pks = changed[start : start + SCHEDULE_BATCH]
        for group, rules in counted:
            if by_schedule := _with_runs_to_delete(group, rules, now, using, pks):
                yield by_schedule


def _with_runs_to_delete(
    group: Group, rules: Rules, now: datetime, using: str, pks: list[int] | None = None
) -> dict[int, Cutoffs]:
    """The cutoffs of the group's schedules (of ``pks`` only, if given) that have finished
    runs to delete. One statement: each schedule's N-th newest finished run, and whether a
    run goes, each a short read of its history index."""
    keep = rules.keep_runs
    assert keep is not None
    finished = Run.objects.filter(schedule=OuterRef("pk"), status__in=Run.FINAL_STATUSES)
    newest = finished.order_by("-plan_time", "-pk").values("plan_time")
    # As cutoffs() lets runs go: before the N-th newest, and past the age rules.
    goes = Q(plan_time__lt=OuterRef("nth"))
    if rules.keep_runs_for is not None:
        goes &= Q(plan_time__lt=now - rules.keep_runs_for)
    if rules.keep_failed_runs_for is not None:
        goes &= ~Q(status=Run.Status.FAILED) | Q(plan_time__lt=now - rules.keep_failed_runs_for)
    schedules = Schedule.objects.using(using).filter(group.members())
    if pks is not None:
        schedules = schedules.filter(pk__in=pks)
    # A run that goes, as a subquery of its own: an EXISTS the database may turn into a join
    # of every finished run, where this is a short read of each schedule's history.
    going = Subquery(finished.filter(goes).values("pk")[:1])
    rows = (
        schedules.annotate(nth=Subquery(newest[keep - 1 : keep]), going=going)
        .filter(going__isnull=False)
        .order_by("pk")
        .values_list("pk", "nth")
    )
    found = {pk: cutoffs(rules, now, nth) for pk, nth in rows}
    return {pk: cut for pk, cut in found.items() if cut is not None}


def _changed_since(since: Mark, now: datetime, counted: list[Ruled], using: str) -> list[int]:
    """The schedules of these groups whose runs changed since ``since``: one of them
    finished (it is at least the mark's run), or has passed an age rule since. One
    statement, on the primary key and the index on plan time."""
    changed = Q(pk__gte=since.runs_from)
    members = Q()
    for group, rules in counted:
        member = group.members("schedule__")
        members |= member
        if rules.keep_runs_for is not None:
            changed |= member & _passed(rules.keep_runs_for, since.at, now)
        if (failed_for := rules.keep_failed_runs_for) is not None:
            changed |= member & Q(status=Run.Status.FAILED) & _passed(failed_for, since.at, now)
    runs = Run.objects.using(using).finished().filter(members, changed).order_by()
    return sorted(runs.values_list("schedule_id", flat=True).distinct())


def _passed(age: timedelta, since: datetime, now: datetime) -> Q:
    """The runs that became older than ``age`` between ``since`` and ``now``."""
    return Q(plan_time__gte=since - age, plan_time__lt=now - age)


def of_schedules(by_schedule: dict[int, Cutoffs], using: str) -> RunQuerySet:
    """The finished runs of these schedules that their cutoffs let go."""
    alike: dict[Cutoffs, list[int]] = {}
    for pk, cut in by_schedule.items():
        alike.setdefault(cut, []).append(pk)
    condition = Q()
    for cut, pks in alike.items():
        condition |= Q(schedule_id__in=pks) & _older(cut)
    return Run.objects.using(using).finished().filter(condition)
