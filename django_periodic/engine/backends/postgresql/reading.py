"""Reads for the admin and the health report on PostgreSQL: a page's recent runs by one
index scan per schedule, the fire lag's percentiles computed by the server, per bucket of
time for the overview page."""

from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Field

from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.backends.sqlite.reading import (
    LAGGED,
    RECENT_RUN_FIELDS,
    UNITS,
    series_window,
)
from django_periodic.engine.records import Bucket
from django_periodic.models import Run
from django_periodic.models.run import RELEASE


def fire_lag(since: datetime, using: str) -> tuple[int, timedelta | None, timedelta | None]:
    """How many first attempts started since ``since``, and their lag's p50 and p99."""
    runs = Run.objects.using(using)
    table = connections[using].ops.quote_name(Run._meta.db_table)
    lag = f"started_at - {rules.expression(runs, RELEASE)}"
    lagged, params = rules.condition(runs.filter(LAGGED), "lagged")
    sql = (
        "SELECT count(*),"
        f" percentile_cont(0.5) WITHIN GROUP (ORDER BY {lag}),"
        f" percentile_cont(0.99) WITHIN GROUP (ORDER BY {lag})"
        f" FROM {table} WHERE {lagged} AND started_at >= %(since)s"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {**params, "since": since})
        runs, p50, p99 = cursor.fetchone()
    return runs, p50, p99


# Runs started in a window per bucket, and the lag's percentiles of those LAGGED: one pass
# over the window's runs, read through the plan time index (series_window).
_SERIES_SQL = """
SELECT date_trunc(%(unit)s, started_at, 'UTC') AS bucket, count(*),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY {lag}) FILTER (WHERE {lagged}),
    percentile_cont(0.99) WITHIN GROUP (ORDER BY {lag}) FILTER (WHERE {lagged})
FROM {table}
WHERE {window}
GROUP BY bucket
ORDER BY bucket
"""


def run_series(since: datetime, until: datetime, unit: str, using: str) -> list[Bucket]:
    """Runs started in [``since``, ``until``) per ``unit`` (minute or hour, UTC), with
    their lag's p50 and p99, computed by the server."""
    assert unit in UNITS, unit
    runs = Run.objects.using(using)
    lagged, lagged_params = rules.condition(runs.filter(LAGGED), "lagged")
    window, window_params = rules.condition(runs.filter(series_window(since, until)), "window")
    sql = _SERIES_SQL.format(
        lag=f"started_at - {rules.expression(runs, RELEASE)}",
        lagged=lagged,
        window=window,
        table=connections[using].ops.quote_name(Run._meta.db_table),
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {**lagged_params, **window_params, "unit": unit})
        return [tuple(row) for row in cursor.fetchall()]


# One index scan with a LIMIT per schedule (periodic_run_history: schedule, -plan_time).
_RECENT_RUNS_SQL = """
SELECT {selected_of_run}
FROM unnest(%(ids)s::bigint[]) AS listed(id)
CROSS JOIN LATERAL (
    SELECT {selected}
    FROM {table}
    WHERE schedule_id = listed.id
    ORDER BY plan_time DESC, id DESC
    LIMIT %(limit)s
) AS run
"""


def recent_runs(ids: list[int], using: str, limit: int) -> list[tuple[Any, ...]]:
    columns = [_column(name) for name in RECENT_RUN_FIELDS]
    sql = _RECENT_RUNS_SQL.format(
        table=connections[using].ops.quote_name(Run._meta.db_table),
        selected=", ".join(columns),
        selected_of_run=", ".join(f"run.{column}" for column in columns),
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {"ids": ids, "limit": limit})
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows


def _column(name: str) -> str:
    field = Run._meta.pk if name == "pk" else Run._meta.get_field(name)
    assert isinstance(field, Field)  # a concrete field: it has a column
    return str(field.column)
