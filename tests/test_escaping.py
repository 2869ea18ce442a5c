"""Stored text written to a terminal or a log is escaped (escaping.py): periodic_status, plain
and rich, and the run log."""

import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_periodic.escaping import escaped
from django_periodic.models import Schedule
from django_periodic.testing import run_due
from tests.factories import ScheduleFactory

# Clears the screen, moves to its top left, turns red; a carriage return writes over the
# line; rich markup would style what follows.
FORGED = "\x1b[2J\x1b[H\x1b[31mevil\rok [bold red]fake[/]"
FORGED_LINE = "nightly\n2026-01-01 00:00:00 INFO Run 1 of payroll finished: succeeded"


def test_escaping_writes_controls_and_backslashes_as_a_string_literal_would():
    assert escaped("plain, ü, 日本") == "plain, ü, 日本"
    assert escaped("a\nb\r\x1b[31m\t\u202e") == "a\\nb\\r\\x1b[31m\\t\\u202e"
    assert escaped("a\\nb") == "a\\\\nb"  # not the same as an escaped newline


@pytest.fixture
def forged(now, process):
    """A schedule whose name, error, pause reason and pauser forge terminal output."""
    schedule = ScheduleFactory(name=FORGED)
    Schedule.objects.filter(pk=schedule.pk).update(
        last_error=f"Cannot plan: {FORGED}",
        paused_until=now + timedelta(hours=1),
        pause_reason=FORGED,
        paused_by=FORGED,
    )
    return schedule


def status(**options) -> str:
    out = StringIO()
    call_command("periodic_status", stdout=out, **options)
    return out.getvalue()


def assert_escaped(text: str) -> None:
    assert "\r" not in text and "\x1b[2J" not in text and "\x1b[31m" not in text
    assert "\\x1b[2J\\x1b[H\\x1b[31mevil\\rok" in text


def test_periodic_status_escapes_stored_text_in_plain_text(forged):
    text = status()
    assert_escaped(text)
    assert "[bold red]fake[/]" in text
    assert text.count(escaped(FORGED)) >= 4  # in each section: due, errors, paused (x2)


def test_periodic_status_escapes_stored_text_and_markup_in_rich_tables(forged, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per cell
    text = status(force_color=True)
    assert "│" in text or "┃" in text  # drawn as a table
    assert_escaped(text)
    assert "[bold red]fake[/]" in text  # shown, not read as markup


def test_periodic_status_escapes_the_names_in_its_error_message(now):
    ScheduleFactory(name=FORGED, alert_failures=3)
    Schedule.objects.filter(name=FORGED).update(attention_reason="failing", attention_since=now)
    with pytest.raises(CommandError) as failed:
        status()
    assert "\x1b" not in str(failed.value) and escaped(FORGED) in str(failed.value)


@pytest.mark.django_db(transaction=True)
def test_a_run_log_line_stays_one_line_whatever_the_schedules_name(run_log, caplog):
    caplog.set_level(logging.INFO, logger="django_periodic.runs")
    schedule = ScheduleFactory(name=FORGED_LINE)
    run_due(now=schedule.next_fire_at)
    records = [r for r in caplog.records if r.name == "django_periodic.runs"]
    assert [r.event for r in records] == ["planned", "started", "finished"]
    for record in records:
        assert "\n" not in record.getMessage()
        assert escaped(FORGED_LINE) in record.getMessage()
        assert record.schedule == FORGED_LINE  # the field as it is, for JSON formatters
    assert len(caplog.text.splitlines()) == len(caplog.records)
