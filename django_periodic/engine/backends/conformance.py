"""Type-checked, never imported: each backend provides every operation of ``Ledger`` with
its signature (mypy checks a module against a protocol as it does a class)."""

from django_periodic.engine.backends import Ledger, portable, postgresql

PORTABLE: Ledger = portable
POSTGRESQL: Ledger = postgresql
