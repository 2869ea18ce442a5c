"""Durable periodic jobs for Django: schedules in the database, exactly-once planning, leases."""

from django_periodic.engine.loop.context import JobContext
from django_periodic.registry import UnknownJob, job
from django_periodic.timing.triggers import InvalidTrigger

__all__ = ["InvalidTrigger", "JobContext", "UnknownJob", "job"]
