"""Helpers for testing your own jobs and schedules, in any test runner.

``run_due()`` runs what is due in the calling thread through the real planner, claims,
executor and outcomes; ``call_job()`` calls one job with a real ``JobContext``;
``fire_times()`` and ``assert_fire_times()`` check a schedule's fire times, DST included.
pytest users get fixtures from ``django_periodic.testing.pytest_plugin``.

The helpers are imported on first use (they need the models), so that the pytest plugin in
this package loads before Django is set up.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_periodic.testing.calling import call_job
    from django_periodic.testing.fires import assert_fire_times, fire_times
    from django_periodic.testing.running import run_due

__all__ = ["assert_fire_times", "call_job", "fire_times", "run_due"]

_MODULES = {
    "assert_fire_times": "fires",
    "call_job": "calling",
    "fire_times": "fires",
    "run_due": "running",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULES[name]}"), name)
