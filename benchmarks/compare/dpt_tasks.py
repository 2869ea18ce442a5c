"""The django-tasks task that django-periodic-tasks schedules in the comparison."""

from django_tasks import task


@task()
def noop() -> None:
    """Does nothing."""
