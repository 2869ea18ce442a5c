"""The ledger's backends: what writes and reads the runs, one class per kind of database,
one instance per alias, chosen once (``db.features``), as Django chooses
``connection.ops``:

- ``sqlite``: the base, every operation through the ORM (SQLite's backend);
- ``postgresql``: a subclass that overrides its statements, each operation one round trip
  where it can be.

The backends are the engine's leaves: they import the models, ``db``, the pure core and
``engine/records.py``, nothing else of the engine. The engine's modules own the rules and
the flow (what a claim takes, how an outcome is decided, each run's release and deadline)
and hand ``ledger(using)`` plain records; the fallback of a batch the database refuses, one
row at a time, is the engine's (``engine/batches.py``), the same for both.
"""

from functools import cache

from django.utils.module_loading import import_string

from django_periodic import db
from django_periodic.engine.backends.sqlite import SQLiteLedger


def ledger(using: str) -> SQLiteLedger:
    """The ledger backend of the database ``using``."""
    return _ledger(using, db.features(using).ledger)


@cache
def _ledger(using: str, path: str) -> SQLiteLedger:
    backend: type[SQLiteLedger] = import_string(path)
    return backend(using)
