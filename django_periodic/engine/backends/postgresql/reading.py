"""Reads for the admin and the health report on PostgreSQL: a page's recent runs by one
index scan per schedule, the fire lag's percentiles computed by the server."""

from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Field

from django_periodic.engine.backends.portable.reading import RECENT_RUN_FIELDS
from django_periodic.engine.backends.postgresql import rules
from django_periodic.models import (
    RELEASE,
    Run,
)


def fire_lag(since: datetime, using: str) -> tuple[int, timedelta | None, timedelta | None]:
    """How many first attempts started since ``since``, and their lag's p50 and p99."""
    runs = Run.objects.using(using)
    table = connections[using].ops.quote_name(Run._meta.db_table)
    lag = f"started_at - {rules.expression(runs, RELEASE)}"
    sql = (
        "SELECT count(*),"
        f" percentile_cont(0.5) WITHIN GROUP (ORDER BY {lag}),"
        f" percentile_cont(0.99) WITHIN GROUP (ORDER BY {lag})"
        f" FROM {table} WHERE attempt = 1 AND started_at >= %s AND trigger <> %s"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [since, Run.Trigger.BACKFILL])
        runs, p50, p99 = cursor.fetchone()
    return runs, p50, p99


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
