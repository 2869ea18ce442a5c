"""The PostgreSQL ledger: our own statements, most operations one round trip, with arrays
as parameters, prepared on the server, timestamps parsed once (``db/``)."""

from django_periodic.engine.backends.common import (
    backfill,
    cancel,
    override_runs,
    plan_extra_runs,
)
from django_periodic.engine.backends.postgresql.claims import claim
from django_periodic.engine.backends.postgresql.fires import (
    SNAPSHOT_COLUMNS_LOADED,
    insert_backfill,
    record_fires,
)
from django_periodic.engine.backends.postgresql.look_ahead import look_ahead
from django_periodic.engine.backends.postgresql.reading import fire_lag, recent_runs, run_series
from django_periodic.engine.backends.postgresql.runs import (
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
