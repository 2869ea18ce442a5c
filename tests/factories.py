import dataclasses
from datetime import datetime, timedelta
from typing import Any

import factory
from django.core.exceptions import FieldDoesNotExist
from factory.django import DjangoModelFactory

from django_periodic.db import clock
from django_periodic.engine.records import Due
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess


class ScheduleFactory(DjangoModelFactory):
    class Meta:
        model = Schedule

    name = factory.Sequence(lambda n: f"schedule-{n}")
    job = "tests.jobs.noop"
    interval = timedelta(minutes=1)


class RunFactory(DjangoModelFactory):
    class Meta:
        model = Run

    schedule = factory.SubFactory(ScheduleFactory)
    plan_time = factory.LazyFunction(clock.wall_now)
    job_name = factory.SelfAttribute("schedule.job")
    args = factory.SelfAttribute("schedule.args")
    kwargs = factory.SelfAttribute("schedule.kwargs")
    max_attempts = factory.SelfAttribute("schedule.max_attempts")
    schedule_revision = factory.SelfAttribute("schedule.revision")


class SchedulerProcessFactory(DjangoModelFactory):
    """A registered scheduler process, alive: its heartbeat is when it started."""

    class Meta:
        model = SchedulerProcess

    host = factory.Sequence(lambda n: f"host-{n}")
    pid = factory.Sequence(lambda n: 1000 + n)
    started_at = factory.LazyFunction(clock.now)
    heartbeat_at = factory.SelfAttribute("started_at")


class LeaseFactory(DjangoModelFactory):
    """A held lease on the run's current attempt, as ``claims.claim`` writes it."""

    class Meta:
        model = Lease

    run = factory.SubFactory(RunFactory, status=Run.Status.RUNNING, attempt=1)
    attempt = factory.LazyAttribute(lambda lease: lease.run.attempt or 1)
    process = factory.SubFactory(SchedulerProcessFactory)
    holder = factory.LazyAttribute(lambda lease: str(lease.process) if lease.process else "")
    acquired_at = factory.LazyFunction(clock.now)
    heartbeat_at = factory.SelfAttribute("acquired_at")
    expires_at = factory.LazyAttribute(
        lambda lease: lease.heartbeat_at + lease.run.schedule.lease_timeout
    )


def due_row(at: datetime, **columns: Any) -> Due:
    """A due schedule's columns as the planner loads them, built in memory so that they may
    hold what the database's checks refuse: a new schedule's defaults, every minute from
    ``at`` and due then; ``columns`` set any of them."""
    values = {
        field.name: _new_schedules(field.name)
        for field in dataclasses.fields(Due)
        if field.default is dataclasses.MISSING
    }
    values |= {
        "pk": 1,
        "name": "row",
        "job": "tests.jobs.noop",
        "timezone": "UTC",
        "interval": timedelta(minutes=1),
        "start_at": at,
        "created_at": None,  # loaded only where it anchors an interval
        "next_fire_at": at,
    }
    return Due(**(values | columns))


def _new_schedules(column: str) -> Any:
    """What a new schedule holds in ``column`` (None for a column without a default)."""
    try:
        field = Schedule._meta.get_field(column)
    except FieldDoesNotExist:
        return None
    return field.get_default() if field.has_default() else None


def schedule_form_data(**overrides) -> dict:
    """POST data of a valid cron schedule for the admin's schedule form."""
    return {
        "name": "from-admin",
        "job": "tests.jobs.add",
        "args": "[1, 2]",
        "kwargs": "{}",
        "enabled": "on",
        "trigger_kind": "cron",
        "cron": "* * * * *",
        "timezone": "UTC",
        "overlap": "skip",
        "max_queued": "1",
        "misfire": "latest",
        "misfire_grace": "00:01:00",
        "max_attempts": "1",
        "retry_backoff": "00:00:10",
        "lease_timeout": "00:00:30",
        "on_closed_day": "skip",
        "after_outcome": "succeeded",
        "after_wait": "01:00:00",
        **overrides,
    }
