"""Connection poolers in transaction mode (PgBouncer): what needs a session, and where it goes.

Behind a pooler in transaction mode a client's connection is a database session for one
transaction only: after each, the pooler hands the server connection to another client.
Django's marker for such an alias is ``DISABLE_SERVER_SIDE_CURSORS = True``, which its
documentation requires there, and we read it the same way. Three things of ours need a
session, and on such an alias:

- the wake-up listener (``LISTEN``), and the process's session lock that rides on the
  listener's connection (engine/runs/presence.py), go to ``WAKEUP_DATABASE``: the alias of a direct
  connection to the same database. Without one the loop polls every ``POLL_INTERVAL``,
  and a dead process's runs wait for their leases to expire;
- our prepared statements (prepared.py) stay unprepared unless the alias's ``OPTIONS``
  names a ``prepare_threshold`` (PgBouncer 1.21+ with ``max_prepared_statements``);
- the pruning lock (operations/retention.py) is not taken: two processes may prune at once, which
  costs work and loses nothing.

NOTIFY needs no session: it is sent at a commit, which the pooler passes through.
"""

from typing import Any

from django.db import connections

from django_periodic.conf import get_settings


def transaction_pooled(using: str) -> bool:
    """Whether ``using`` is marked as going through a pooler in transaction mode."""
    return marked_pooled(connections[using].settings_dict)


def marked_pooled(database: dict[str, Any]) -> bool:
    """Whether a ``DATABASES`` entry carries Django's transaction-pooling marker."""
    return bool(database.get("DISABLE_SERVER_SIDE_CURSORS"))


def listener_alias(using: str) -> str | None:
    """The alias whose connection listens for the wake-ups sent on ``using``: the
    ``WAKEUP_DATABASE`` setting, else ``using`` itself unless it is transaction-pooled;
    None: no listener (the loop polls)."""
    wakeup = get_settings().WAKEUP_DATABASE
    if wakeup:
        return wakeup
    return None if transaction_pooled(using) else using


def prepares(using: str) -> bool:
    """Whether our statements on ``using`` may be prepared on the server: unless its
    ``OPTIONS`` set ``prepare_threshold`` to None, or it is transaction-pooled and they do
    not set one (PgBouncer before 1.21 loses prepared statements between transactions)."""
    options = connections[using].settings_dict.get("OPTIONS", {})
    if "prepare_threshold" in options:
        return options["prepare_threshold"] is not None
    return not transaction_pooled(using)
