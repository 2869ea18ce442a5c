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
