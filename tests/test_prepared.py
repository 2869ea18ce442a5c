"""The claim, outcome and start-mark statements are prepared on the server once per
connection (db/prepared.py), without turning preparing on for the jobs' queries, and
not at all when the database's OPTIONS say ``prepare_threshold: None`` (PgBouncer)."""

import pytest
from django.db import connection

from django_periodic.engine.runs import claims, leases
from tests import ledger
from tests.factories import RunFactory, ScheduleFactory

pytestmark = pytest.mark.usefixtures("postgres")


def run_three(process, now) -> None:
    for _ in range(3):
        RunFactory(schedule=ScheduleFactory(), plan_time=now)
        (claim,) = claims.claim(process, now, 1)
        assert leases.mark_started([claim.token]) == {claim.token}
        assert ledger.succeed(claim, now, "ok")


def prepared() -> list[tuple[str, int]]:
    """This session's prepared statements: their first words, and how often each ran."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        return sorted((" ".join(text.split())[:40], runs) for text, runs in cursor.fetchall())


def test_each_statement_is_prepared_once_and_the_connection_keeps_its_threshold(process, now):
    run_three(process, now)
    statements = prepared()
    assert [runs for _text, runs in statements] == [3, 3, 3]  # claim, outcome, start mark
    assert any(text.startswith("UPDATE") for text, _runs in statements)  # the start mark
    assert connection.connection.prepare_threshold is None  # Django's: jobs' queries unprepared


def test_a_prepare_threshold_of_none_in_options_prepares_nothing(process, now, settings):
    options = connection.settings_dict["OPTIONS"]
    connection.settings_dict["OPTIONS"] = {**options, "prepare_threshold": None}
    try:
        run_three(process, now)
    finally:
        connection.settings_dict["OPTIONS"] = options
    assert prepared() == []
