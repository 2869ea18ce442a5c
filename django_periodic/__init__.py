"""Durable periodic jobs for Django: schedules in the database, exactly-once planning, leases."""

from django_periodic.registry import job

__all__ = ["job"]
