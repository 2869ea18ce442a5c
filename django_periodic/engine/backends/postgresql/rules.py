"""SQL fragments that restate a Python rule, built from that rule (PostgreSQL statements).

A statement written by hand next to the one function that runs it would repeat rules the
ORM already states (which runs await their release, which are claimable, which plan times
the ledger holds once) and drift from them. These build the fragment from the rule itself;
tests/test_rules.py checks that the statements and the ORM agree.
"""

import itertools
import re
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Expression, F, QuerySet

from django_periodic.choices import LEDGER_TRIGGERS

_PLACEHOLDER = re.compile(r"(?<!%)%s")


def condition(queryset: QuerySet[Any], prefix: str, alias: str = "") -> tuple[str, dict[str, Any]]:
    """The WHERE condition of ``queryset`` as SQL with named parameters (``prefix_0``, ...),
    for a statement that reads the model's table under its own name, or as ``alias``."""
    query = queryset.query
    compiler = query.get_compiler(using=queryset.db)
    try:
        sql, params = query.where.as_sql(compiler, compiler.connection)
    except EmptyResultSet:  # e.g. a filter on an empty list of values: no row
        return "false", {}
    names = (f"{prefix}_{n}" for n in itertools.count())
    named: dict[str, Any] = {}

    def name_one(_match: re.Match[str]) -> str:
        name = next(names)
        named[name] = params[len(named)]
        return f"%({name})s"

    sql = _PLACEHOLDER.sub(name_one, sql)
    if alias:
        table = compiler.connection.ops.quote_name(queryset.model._meta.db_table)
        sql = sql.replace(f"{table}.", f"{alias}.")
    return sql, named


def expression(queryset: QuerySet[Any], value: Expression | F) -> str:
    """``value`` (a column or expression without parameters) as SQL, for a statement that
    reads ``queryset``'s table under its own name."""
    query = queryset.query
    compiler = query.get_compiler(using=queryset.db)
    sql, params = compiler.compile(value.resolve_expression(query))
    assert not params, f"{value} takes parameters"
    return str(sql)


def ledger_conflict() -> str:
    """The ON CONFLICT target of the ledger's constraint (one run per schedule, scope and
    plan time, for the triggers of ``LEDGER_TRIGGERS``)."""
    triggers = ", ".join(f"'{trigger}'" for trigger in LEDGER_TRIGGERS)
    return f"(schedule_id, scope, plan_time) WHERE trigger IN ({triggers})"
