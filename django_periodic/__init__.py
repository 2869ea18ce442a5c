"""Durable periodic jobs for Django: schedules in the database, exactly-once planning, leases."""

from django_periodic.engine.context import JobContext
from django_periodic.registry import UnknownJob, job
from django_periodic.triggers import InvalidTrigger

__all__ = ["InvalidTrigger", "JobContext", "UnknownJob", "job"]
