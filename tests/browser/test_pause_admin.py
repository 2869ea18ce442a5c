"""Pausing a schedule with a reason from the schedule list, and resuming it, in a real
browser: the list, the schedule's page and its history say who paused it, why, until when."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="pause demo", job="demo.jobs.greet", args=["pause"],
                    cron="*/10 * * * *", timezone="UTC")
schedule.full_clean()
schedule.save()
"""
FORMAT = "%Y-%m-%dT%H:%M:%S"  # a datetime-local input's value, to the second


def select_and_act(page, action: str) -> None:
    page.goto("/admin/django_periodic/schedule/?q=pause+demo")
    page.locator("#result_list tbody tr").first.locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_an_operator_pauses_a_schedule_with_a_reason_then_resumes_it(admin_page, example_site):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    select_and_act(page, "pause")
    expect(page.locator("#pause-schedules")).to_contain_text("pause demo")

    # A pause that has already ended is refused on its field, and says why.
    past = datetime.now(UTC) - timedelta(hours=1)
    page.fill("#id_until", past.strftime(FORMAT))
    page.fill("#id_reason", "database upgrade")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".field-until .errorlist")).to_contain_text("A pause ends in the future")

    # The example project's TIME_ZONE is UTC: the form's times are UTC too.
    until = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    page.fill("#id_until", until.strftime(FORMAT))
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".messagelist")).to_contain_text("Paused 1 schedule.")
    row = page.locator("#result_list tbody tr").filter(has_text="pause demo")
    expect(row.locator(".periodic-paused")).to_contain_text(until.strftime("%Y-%m-%d %H:%M"))

    row.get_by_role("link", name="pause demo").click()
    expect(page.locator(".field-pause_state")).to_contain_text("database upgrade")
    page.get_by_role("link", name="History").click()
    expect(page.locator("#change-history")).to_contain_text("by admin: database upgrade")

    select_and_act(page, "resume")
    expect(page.locator(".messagelist")).to_contain_text("Resumed 1 paused schedule.")
    expect(row.locator(".periodic-paused")).to_have_count(0)
