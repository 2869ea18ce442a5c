from datetime import timedelta

import factory
from factory.django import DjangoModelFactory

from django_periodic import clock
from django_periodic.models import Run, Schedule


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
        **overrides,
    }
