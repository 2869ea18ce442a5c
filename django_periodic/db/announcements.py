"""What is announced once the transaction that made a change commits: signals to their
receivers, and wake-ups to the schedulers. A receiver never hears of a change that was
rolled back, nor before other connections can see it; a woken scheduler always sees the
rows that woke it.

Wake-ups are a NOTIFY on the schedulers' channel when there is new work. Only PostgreSQL
has them; elsewhere ``notify`` does nothing and schedulers poll at ``POLL_INTERVAL``. The
listening side is ``engine/loop/wakeups.py``; the statements, ``db/postgresql.py``.
"""

from collections.abc import Iterable
from functools import partial

from django.db import connections, transaction

from django_periodic import signals
from django_periodic.db import features, postgresql


def send_on_commit(events: Iterable[signals.Event], using: str) -> None:
    """Send the events once the current transaction on ``using`` commits (at once outside
    one); never if it rolls back."""
    events = list(events)
    if events:
        transaction.on_commit(partial(signals.send, events), using=using)


def notify(using: str = "default") -> None:
    """Wake every listening scheduler (at commit, if inside a transaction)."""
    if not features(using).has_sessions:
        return
    with connections[using].cursor() as cursor:
        postgresql.notify(cursor)
