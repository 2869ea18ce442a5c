"""Sentry Crons: a monitor per schedule, and check-ins for each run (``SENTRY_CRONS``)."""


def follow() -> None:
    """Connect the receivers if the setting is on (to be written)."""
