"""Ping monitors: each schedule's ``ping_url`` told when its runs start and end (``PINGS``)."""


def follow() -> None:
    """Connect the receivers if the setting is on (to be written)."""
