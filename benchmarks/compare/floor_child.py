"""The writing job's floor: its INSERT in a plain loop on one connection, no scheduler.

    python floor_child.py ROWS   # tests.settings, CONN_MAX_AGE 0 (see workloads.floor)

Each row is written as ``tests.jobs.record`` writes it (``Execution.objects.create``,
autocommit). Prints the seconds the ROWS inserts took, as JSON.
"""

import json
import os
import sys
import time
from datetime import UTC, datetime

import django

django.setup()

from tests.models import Execution  # noqa: E402


def write(rows: int) -> float:
    plan_time = datetime.now(UTC)
    pid = os.getpid()
    # The connection is opened (and the statement's path warmed) before the clock starts.
    Execution.objects.create(schedule="floor", plan_time=plan_time, attempt=1, pid=pid)
    started = time.perf_counter()
    for _ in range(rows):
        Execution.objects.create(schedule="floor", plan_time=plan_time, attempt=1, pid=pid)
    return time.perf_counter() - started


if __name__ == "__main__":
    print(json.dumps({"seconds": write(int(sys.argv[1]))}))
