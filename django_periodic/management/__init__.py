"""The numbers the commands' options take, held to their ranges as the settings' are.

An option that stands for a setting (``--workers``, ``--keep-runs``) has that setting's
range, read from ``conf.RANGES``; a number past it is a CommandError that says the range,
never a traceback from deeper down (a timedelta or a thread that cannot be made).
"""

from django.core.management.base import CommandError

from django_periodic.timing import bounds

# A TCP port; 0 asks the system for a free one.
PORTS = bounds.Range(0, 65535)


def check_range(option: str, value: int | None, valid: bounds.Range[int]) -> None:
    """Raise CommandError, saying the range, unless ``value`` (given to ``option``,
    "--days") is within ``valid`` or not given."""
    if message := valid.error(option, value):
        raise CommandError(message)
