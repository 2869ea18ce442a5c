"""Explaining fires and confirming a change of them in a real browser: a schedule's
"Explain" page lists each fire of the window with what became of it (the example's
scheduler runs them), and an edit of its trigger shows the fires it removes before saving."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="explain demo", job="demo.jobs.greet", args=["explain"],
                    cron="* * * * *", timezone="UTC")
schedule.full_clean()
schedule.save()
"""


def open_schedule(page) -> None:
    page.goto("/admin/django_periodic/schedule/?q=explain+demo")
    page.locator("#result_list").get_by_role("link", name="explain demo").click()


def test_an_operator_sees_each_fire_explained_and_confirms_a_trigger_edit(admin_page, example_site):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    open_schedule(page)
    page.get_by_role("link", name="Explain").click()
    page.select_option("#id_window", "24h")
    page.get_by_role("button", name="Show").click()
    # The example's scheduler runs it at the next minute: its fire then reads succeeded,
    # coloured, with its run linked.
    fires = page.locator("#explain-fires")
    reload_until(page, fires, "succeeded", timeout=120)
    succeeded = fires.locator("tr.periodic-fire-succeeded").first
    expect(succeeded.locator(".periodic-tone-ok")).to_have_text("succeeded")
    succeeded.get_by_role("link").click()
    expect(page.locator(".field-status_badge")).to_contain_text("succeeded")

    # Every two minutes instead of every minute: the odd minutes' fires are removed. The
    # diff is shown, not saved, until confirmed.
    open_schedule(page)
    page.fill("#id_cron", "*/2 * * * *")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator("#diff-removed")).to_be_visible()
    expect(page.locator("h2").filter(has_text="fires removed")).to_be_visible()
    expect(page.locator("#diff-added")).to_have_count(0)
    page.get_by_role("link", name="Go back").click()
    expect(page.locator("#id_cron")).to_be_visible()  # the form again, nothing saved
    open_schedule(page)
    expect(page.locator("#id_cron")).to_have_value("* * * * *")
    page.fill("#id_cron", "*/2 * * * *")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".messagelist")).to_contain_text("explain demo")
    open_schedule(page)
    expect(page.locator("#id_cron")).to_have_value("*/2 * * * *")
