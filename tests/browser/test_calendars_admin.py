"""Calendars in a real browser: a calendar made on its page (a bad date refused on its field),
ticked on a schedule's form, whose live preview then lists the closed fires with the
calendar and reason that closed them, and what becomes of them."""

import re

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="calendar demo", job="demo.jobs.greet", args=["calendar"],
                    cron="0 9 * * *", timezone="UTC", on_closed_day="next_open_day")
schedule.full_clean()
schedule.save()
"""


def test_an_operator_closes_weekends_and_sees_the_closed_fires_in_the_preview(
    admin_page, example_site
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/calendar/add/")
    page.fill("#id_name", "office weekends")
    page.fill("#id_timezone", "UTC")
    page.get_by_label("Saturday").check()
    page.get_by_label("Sunday").check()
    page.fill("#id_closed_dates", "24.12.2026")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".field-closed_dates .errorlist")).to_contain_text(
        "24.12.2026 is not a date such as 2026-12-24."
    )
    page.fill("#id_closed_dates", "2026-12-24")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("office weekends")
    expect(page.locator("#result_list")).to_contain_text("Sat, Sun")

    page.goto("/admin/django_periodic/schedule/?q=calendar+demo")
    page.locator("#result_list").get_by_role("link", name="calendar demo").click()
    preview = page.locator("#periodic-preview")
    expect(preview.locator("tr.periodic-closed")).to_have_count(0)
    # Ticking the calendar refreshes the live preview: the weekend's fires are listed,
    # struck through, with why and when they run instead.
    page.get_by_label("office weekends").check()
    closed = preview.locator("tr.periodic-closed")
    # The first closed fire is Saturday's, or Sunday's when the test runs on a Saturday.
    expect(closed.first).to_contain_text(re.compile("office weekends: closed on (Satur|Sun)days"))
    expect(closed.first).to_contain_text("runs Mon")
    page.get_by_role("button", name="Save", exact=True).click()
    # It moves fires: the page of the fires it changes asks to confirm (admin/changes/explain.py).
    expect(page.locator("#fire-diff-form")).to_be_visible()
    page.locator("input[name=_save_confirmed]").click()
    expect(page.locator(".messagelist")).to_contain_text("calendar demo")

    # Saved: the schedule's own page shows the same, rendered by the server.
    page.locator("#result_list").get_by_role("link", name="calendar demo").click()
    expect(page.locator("#periodic-preview tr.periodic-closed").first).to_contain_text(
        "office weekends"
    )
    expect(page.locator(".field-closed_fires")).to_contain_text("none")
