"""Durable periodic jobs for Django: schedules in the database, exactly-once planning, leases."""

import importlib
from typing import Any

from django_periodic.engine.context import JobContext
from django_periodic.registry import UnknownJob, job
from django_periodic.triggers import InvalidTrigger

__all__ = ["InvalidTrigger", "JobContext", "UnknownJob", "job"]


def __getattr__(name: str) -> Any:
    # ``from django_periodic import leases`` was documented for cancelling runs before
    # ``Run.objects.filter(...).cancel()``; the module now lives in the engine.
    if name == "leases":
        return importlib.import_module("django_periodic.engine.leases")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
