"""The ledger operations the models' thin methods call, the same on every backend (each
calls the backend for its statements): cancel, backfill, a run outside the plan times."""

from django_periodic.engine.planning.backfill import backfill
from django_periodic.engine.planning.overlap import plan_extra_runs
from django_periodic.engine.runs.leases import request_cancel as cancel

__all__ = ["backfill", "cancel", "plan_extra_runs"]
