"""Wake-ups sent: a NOTIFY on the schedulers' channel when there is new work.

Only PostgreSQL has them; elsewhere ``notify`` does nothing and schedulers poll at
``POLL_INTERVAL``. A notification sent inside a transaction is delivered at its commit,
so a woken scheduler always sees the rows that caused it. The listening side is
``engine/loop/wakeups.py``; the statements, ``db/postgresql.py``.
"""

from django.db import connections

from django_periodic.db import features, postgresql


def notify(using: str = "default") -> None:
    """Wake every listening scheduler (at commit, if inside a transaction)."""
    if not features(using).has_sessions:
        return
    with connections[using].cursor() as cursor:
        postgresql.notify(cursor)
