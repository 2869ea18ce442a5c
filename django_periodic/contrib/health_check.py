"""A check for django-health-check (4.x), which lists its checks on its view::

HealthCheckView.as_view(checks=["django_periodic.contrib.health_check.PeriodicHealth"])
"""

import dataclasses

from asgiref.sync import sync_to_async
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from django_periodic.db import clock
from django_periodic.operations import health


@dataclasses.dataclass
class PeriodicHealth(HealthCheck):  # type: ignore[misc]  # untyped package
    """Unavailable when :func:`django_periodic.operations.health.attention` finds a problem."""

    using: str = "default"

    async def run(self) -> None:
        # The ORM is synchronous; thread-sensitive, like the request's own queries.
        problems = await sync_to_async(_attention)(self.using)
        if problems:
            raise ServiceUnavailable("; ".join(problem.message for problem in problems))


def _attention(using: str) -> list[health.Problem]:
    return health.attention(clock.now(using), using)
