"""The runs a schedule records on request, besides those the planner records as it fires:
a manual run (``run_now()``, ``run_now_for_all_scopes()``), a backfill of past plan times
(``backfill()``), any extra run under the overlap policy (``plan_extra_run()``, a retry's).
Each is a thin method of ``Schedule``, from the ``ExtraRuns`` mixin, that calls the engine.
"""

from datetime import datetime
from typing import Any

from django_periodic import choices, db
from django_periodic import scopes as scope_providers
from django_periodic.db import clock
from django_periodic.models.run import Run
from django_periodic.models.schedule_fields import ScheduleFields


class ExtraRuns(ScheduleFields):
    """The runs a schedule records on request: ``run_now()``, ``run_now_for_all_scopes()``,
    ``backfill()``, ``plan_extra_run()``, ``plan_extra_runs()``."""

    class Meta:
        abstract = True

    def run_now(self, scope: str = "") -> Run:
        """Record a manual run for a scheduler to execute; never runs the job in this thread.

        On a fanned-out schedule (``scopes`` set), ``scope`` names the scope key to run for;
        ``run_now_for_all_scopes()`` runs every key the provider returns. Raises
        ValidationError, recording nothing, for a ``finish_within`` stored out of its range.
        """
        if self.scopes and not scope:
            raise ValueError(
                f"Schedule {self.name!r} is fanned out per scope ({self.scopes}): name the "
                "scope key to run for, or run all of them (run_now_for_all_scopes())."
            )
        now = clock.now(self._state.db or "default")
        return self.plan_extra_run(
            now, trigger=choices.RunTrigger.MANUAL, plan_time=now, scope=scope
        )

    def run_now_for_all_scopes(self) -> list[Run]:
        """Record manual runs as a fire would: one per scope key of a fanned-out schedule
        (its provider is called here, before any row is locked), else ``run_now()``'s one."""
        if not self.scopes:
            return [self.run_now()]
        keys = scope_providers.scope_keys(self.scopes)
        now = clock.now(self._state.db or "default")
        return self.plan_extra_runs(
            now, trigger=choices.RunTrigger.MANUAL, plan_time=now, scopes=keys
        )

    def backfill(
        self,
        start: datetime,
        end: datetime,
        *,
        rate: float | None = None,
        now: datetime | None = None,
    ) -> Any:
        """Record a run (trigger ``backfill``) for each plan time of the trigger in
        ``[start, end)`` that has no run yet, one per scope key on a fanned-out self.

        Only past plan times are recorded (``end`` is clamped to the database's clock);
        the cursor does not move. Runs wait until released ``rate`` per second (default
        ``DEFAULT_RATE`` of ``engine/planning/backfill.py``), after the schedule's runs already
        waiting from an earlier backfill. Raises ValueError for a bad range, or more than
        ``MAX_RUNS`` runs. See docs/backfill.md.
        """
        using = self._state.db or "default"
        return db.ledger(using).backfill(self, start, end, rate=rate, now=now)

    def plan_extra_run(
        self,
        now: datetime,
        *,
        trigger: str,
        plan_time: datetime,
        scope: str = "",
        **snapshot: Any,
    ) -> Run:
        """Record a run outside the trigger's plan times (manual, retry) under the overlap
        policy of its scope, like any fire. ``snapshot`` may override the job name,
        arguments and revision (a retry repeats what the failed run called).
        """
        runs = self.plan_extra_runs(
            now, trigger=trigger, plan_time=plan_time, scopes=[scope], **snapshot
        )
        return runs[0]

    def plan_extra_runs(
        self,
        now: datetime,
        *,
        trigger: str,
        plan_time: datetime,
        scopes: list[str],
        **snapshot: Any,
    ) -> list[Run]:
        """Record one extra run per scope key, each under its scope's overlap policy, as a
        fire would (the engine's ``overlap.plan_extra_runs``)."""
        using = self._state.db or "default"
        runs: list[Run] = db.ledger(using).plan_extra_runs(
            self, now, trigger=trigger, plan_time=plan_time, scopes=scopes, **snapshot
        )
        return runs
