"""Signals sent once the transaction that made their change commits: a receiver never
hears of a change that was rolled back, nor before other connections can see it."""

from collections.abc import Iterable
from functools import partial

from django.db import transaction

from django_periodic import signals


def send_on_commit(events: Iterable[signals.Event], using: str) -> None:
    """Send the events once the current transaction on ``using`` commits (at once outside
    one); never if it rolls back."""
    events = list(events)
    if events:
        transaction.on_commit(partial(signals.send, events), using=using)
