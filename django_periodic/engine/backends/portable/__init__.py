"""The portable ledger: every operation through the ORM, on any database Django supports.
A few statements where the PostgreSQL backend sends one; the same rows in the end."""

from django_periodic.engine.backends.common import (
    backfill,
    cancel,
    override_runs,
    plan_extra_runs,
)
from django_periodic.engine.backends.portable.claims import claim
from django_periodic.engine.backends.portable.fires import (
    SNAPSHOT_COLUMNS_LOADED,
    insert_backfill,
    record_fires,
)
from django_periodic.engine.backends.portable.look_ahead import look_ahead
from django_periodic.engine.backends.portable.reading import fire_lag, recent_runs, run_series
from django_periodic.engine.backends.portable.runs import (
    expired_or_orphaned,
    held_to_extend,
    mark_started,
    of_schedules,
    record_outcomes,
)

__all__ = [
    "SNAPSHOT_COLUMNS_LOADED",
    "backfill",
    "cancel",
    "claim",
    "expired_or_orphaned",
    "fire_lag",
    "held_to_extend",
    "insert_backfill",
    "look_ahead",
    "mark_started",
    "of_schedules",
    "override_runs",
    "plan_extra_runs",
    "recent_runs",
    "record_fires",
    "record_outcomes",
    "run_series",
]
