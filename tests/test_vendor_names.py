"""The kind of database is asked of ``db.features(using)`` (or ``db.features_of(config)``
for a ``DATABASES`` entry), never decided by its name elsewhere: outside ``db/`` and the
ledger backends (``engine/backends/``), no code compares a vendor's name or an ``ENGINE``
path, reads ``.vendor``, or imports a driver or a Django database backend by name.

Prose (docstrings, comments, and the words of a message) may name a database: only a
string that is a name alone, or an engine's path, is a decision by name.
"""

import ast
import re
from pathlib import Path

import django_periodic

PACKAGE = Path(django_periodic.__file__).parent
# Where the kind of database is known: the plumbing that asks, and the backends it chooses.
ALLOWED = ("db", "engine/backends")
VENDORS = r"postgres(?:ql)?|sqlite3?|psycopg\d?|mysql|oracle|mariadb"
# A string that is a vendor's name alone, an engine's path, or a driver's module.
VENDOR_STRING = re.compile(rf"(?i)^(?:{VENDORS})$|django\.db\.backends\.|^(?:{VENDORS})\.")
# A module named for a vendor (an import of a driver or of one of Django's backends).
VENDOR_MODULE = re.compile(rf"(?i)(?:^|\.)(?:{VENDORS})(?:\.|$)")


def _modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and not any(path.relative_to(PACKAGE).as_posix().startswith(f"{a}/") for a in ALLOWED)
    )


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (a module's, a class's, a function's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _engine_affix(node: ast.AST) -> bool:
    """Whether ``node`` tests an ENGINE's suffix or prefix (``ENGINE.endswith(...)``)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"endswith", "startswith"}
        and "ENGINE" in ast.unparse(node)
    )


def decisions_by_name(source: str) -> list[str]:
    """What in ``source`` names a database to decide by it, one line each."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and VENDOR_STRING.search(node.value):
                found.append(f"{line}: the string {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append(f"{line}: .vendor")
        elif isinstance(node, ast.Import):
            found += [
                f"{line}: import {alias.name}"
                for alias in node.names
                if VENDOR_MODULE.search(alias.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if VENDOR_MODULE.search(node.module) and not node.module.startswith(
                "django_periodic.db"
            ):
                found.append(f"{line}: from {node.module} import")
        elif _engine_affix(node):
            found.append(f"{line}: {ast.unparse(node)}")
    return found


def test_no_code_outside_db_and_the_backends_decides_by_a_database_name():
    found = {
        path.relative_to(PACKAGE).as_posix(): decisions
        for path in _modules()
        if (decisions := decisions_by_name(path.read_text()))
    }
    assert found == {}


def test_the_test_sees_each_way_of_deciding_by_name():
    source = '''
"""A docstring may say PostgreSQL, or "sqlite"."""
import psycopg
from django.db.backends.postgresql.psycopg_any import is_psycopg3
if connection.vendor == "postgresql":
    pass
if config["ENGINE"].endswith("sqlite3"):
    pass
x = "django.db.backends.mysql"
message = "only PostgreSQL has LISTEN/NOTIFY"  # prose: allowed
'''
    found = sorted(decision.split(": ", 1)[1] for decision in decisions_by_name(source))
    assert found == sorted(
        [
            "import psycopg",
            "from django.db.backends.postgresql.psycopg_any import",
            ".vendor",
            "the string 'postgresql'",
            "config['ENGINE'].endswith('sqlite3')",
            "the string 'sqlite3'",
            "the string 'django.db.backends.mysql'",
        ]
    )
