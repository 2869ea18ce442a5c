"""The documented import path of the backfill API (docs/backfill.md).

``Schedule.backfill()`` is the entry point; the code is the engine's
(``django_periodic.engine.backfill``).
"""

from django_periodic.engine.backfill import DEFAULT_RATE, MAX_RUNS, BackfillResult, backfill

__all__ = ["DEFAULT_RATE", "MAX_RUNS", "BackfillResult", "backfill"]
