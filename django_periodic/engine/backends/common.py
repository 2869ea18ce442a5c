"""The ledger operations the models' thin methods call, the same on every backend (each
calls the backend for its statements): cancel, backfill, a run outside the plan times,
an override applied to a planned fire's runs."""

from django_periodic.engine.planning.backfill import backfill
from django_periodic.engine.planning.overlap import plan_extra_runs
from django_periodic.engine.planning.overrides import override_runs
from django_periodic.engine.runs.leases import request_cancel as cancel

__all__ = ["backfill", "cancel", "override_runs", "plan_extra_runs"]
