"""Template rows for django_periodic, made by its own ORM so every column has its default:
one disabled schedule and one pending run of it. Run with tests.settings (see peers.py)."""

from datetime import UTC, datetime, timedelta

import django

django.setup()

from django_periodic.models import Run, Schedule  # noqa: E402


def main() -> None:
    schedule = Schedule.objects.create(
        name="bench-template", job="tests.jobs.noop", interval=timedelta(hours=1), enabled=False
    )
    Run.objects.create(
        schedule=schedule, plan_time=datetime(2000, 1, 1, tzinfo=UTC), job_name=schedule.job
    )


if __name__ == "__main__":
    main()
