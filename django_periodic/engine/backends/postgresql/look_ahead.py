"""The look ahead in one statement (``HORIZON_SQL``), built from the rows each time of the
horizon is the earliest of (``sqlite/reading.earliest``)."""

from functools import lru_cache
from typing import Any

from django.db import connections

from django_periodic.db import postgresql
from django_periodic.db.postgresql import HELD_SQL
from django_periodic.engine import records
from django_periodic.engine.backends.postgresql import rules
from django_periodic.engine.backends.sqlite.reading import earliest as earliest_of
from django_periodic.models import Lease, SchedulerProcess
from django_periodic.timing.bounds import EARLIEST, LATEST

# Each MIN reads the first entry of a partial index (see Run.Meta.indexes), once (the CTE
# is MATERIALIZED: inlined, every use of a MIN would read it again). Each is held
# within the range of stored times: a row stored past the database's checks with a time
# Python cannot hold (year 20000, say) must not make every look ahead fail; the rows
# themselves fail where they are handled.
HORIZON_SQL = """
WITH m AS MATERIALIZED (SELECT {earliest})
SELECT statement_timestamp(), {within_bounds},
    %(judge)s AND EXISTS (
        SELECT 1 FROM {lease} l WHERE {held} AND l.process_id IN ({lost})
    )
FROM m
"""


EARLIEST_SQL = "(SELECT MIN({column}) FROM {table} WHERE {condition}) AS {name}"


# A time held within [EARLIEST, LATEST]; NULL stays NULL (which LEAST and GREATEST skip).
WITHIN_BOUNDS = (
    "CASE WHEN m.{0} < %(earliest)s THEN %(earliest)s"
    " WHEN m.{0} > %(latest)s THEN %(latest)s ELSE m.{0} END"
)


@lru_cache(maxsize=16)  # one per alias and set of jobs: a process has one or two
def _horizon_sql(using: str, jobs: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    quote = connections[using].ops.quote_name
    selected, params = [], {}
    earliest = earliest_of(using, jobs)
    for name, (rows, of) in earliest.items():
        condition, condition_params = rules.condition(rows, name)
        column = rules.expression(rows, of)
        table = quote(rows.model._meta.db_table)
        selected.append(
            EARLIEST_SQL.format(column=column, table=table, condition=condition, name=name)
        )
        params.update(condition_params)
    sql = HORIZON_SQL.format(
        earliest=",\n    ".join(selected),
        within_bounds=", ".join(WITHIN_BOUNDS.format(name) for name in earliest),
        lease=quote(Lease._meta.db_table),
        held=HELD_SQL,
        lost=postgresql.lost_sql(quote(SchedulerProcess._meta.db_table)),
    )
    return sql, params


def look_ahead(using: str, jobs: tuple[str, ...], judge: bool) -> records.Horizon:
    sql, params = _horizon_sql(using, jobs)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {**params, "earliest": EARLIEST, "latest": LATEST, "judge": judge})
        row = cursor.fetchone()
    assert row is not None
    return records.Horizon(*row)
