"""The range of every value a schedule row may hold, and of every time computed from one.

One home for these bounds: ``Schedule.clean()``, the admin form, the database's CHECK
constraints and the planner all read them from here, so no path can store, or compute,
a value that Python or PostgreSQL cannot represent.
"""

from datetime import UTC, datetime

# Stored and computed times stay within [EARLIEST, LATEST): far enough from Python's and
# PostgreSQL's limits that adding a bounded duration or shifting to any time zone is safe.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

# The cursor of a schedule stored without save() (bulk_create, raw SQL, a fixture): the
# database's default for next_fire_at. The planner plans such a schedule from its trigger
# instead of firing it at this time. Before EARLIEST, so never a real fire time.
UNPLANNED = datetime(1800, 1, 1, tzinfo=UTC)
