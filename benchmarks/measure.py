"""What the benchmark scripts measure alike: queries counted, every due fire planned.

Imported by bench.py, fanout.py and features.py once Django is set up.
"""

import time

from django.db import connection

from django_periodic.conf import get_settings
from django_periodic.engine.planning import planner


class QueryCounter:
    """A database execute wrapper that counts the statements run through it."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def plan_everything_due(now) -> tuple[float, float, int]:
    """Plan every fire due at ``now`` in batches of ``PLAN_BATCH_SIZE``: the seconds it
    took, the queries per batch, and the batch size."""
    counter = QueryCounter()
    batch = get_settings().PLAN_BATCH_SIZE
    batches = 0
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        while planner.plan_due(now, batch_size=batch).schedules:
            batches += 1
    return time.perf_counter() - started, counter.count / max(batches, 1), batch
