"""The look ahead through the ORM: one aggregate per time of the horizon
(``planning/look_ahead.py``)."""

from django.db.models import Min

from django_periodic.db import clock
from django_periodic.engine import records
from django_periodic.engine.planning import fleet
from django_periodic.engine.planning import look_ahead as look_ahead_


def look_ahead(using: str, judge: bool) -> records.Horizon:
    earliest = {
        name: rows.aggregate(at=Min(column))["at"]
        for name, (rows, column) in look_ahead_.earliest(using, fleet.local_jobs()).items()
    }
    return records.Horizon(now=clock.now(using), **earliest)
