"""A cron schedule's DST choice in a real browser: picking one on the schedule's form
refreshes the live preview's list of DST changes, with the chosen rule applied."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="dst demo", job="demo.jobs.greet", args=["dst"],
                    cron="30 2 * * *", timezone="Europe/Berlin")
schedule.full_clean()
schedule.save()
"""


def test_an_operator_picks_a_dst_gap_rule_and_sees_the_spring_forward_day_under_it(
    admin_page, example_site, screenshots
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/schedule/?q=dst+demo")
    page.locator("#result_list").get_by_role("link", name="dst demo").click()
    changes = page.locator("#periodic-dst-changes li.periodic-dst-change")
    # Berlin's next spring-forward, whenever the test runs: 02:30 does not exist that day.
    spring = changes.filter(has_text="daylight saving time starts").first
    expect(spring).to_contain_text("02:30 does not exist")
    expect(spring).to_contain_text("cron(8) default (first valid instant)")

    page.select_option("#id_dst_gap", "skip")
    expect(spring).to_contain_text("not run")
    expect(spring.locator(".periodic-dst-rule")).to_have_text("skip")

    page.select_option("#id_dst_gap", "first_valid")
    expect(spring).to_contain_text("runs 03:00 CEST (01:00 UTC)")
    expect(spring.locator(".periodic-dst-rule")).to_have_text("first valid instant")
    page.select_option("#id_dst_repeat", "both")
    fall = changes.filter(has_text="daylight saving time ends").first
    expect(fall).to_contain_text("runs 02:30 CEST (00:30 UTC), 02:30 CET (01:30 UTC)")
    page.locator("#periodic-dst-changes").scroll_into_view_if_needed()
    page.locator(".field-dst_gap").evaluate("row => row.closest('fieldset').scrollIntoView()")
    page.screenshot(path=screenshots / "dst-preview.png")

    # Saved: the schedule's own page shows the same, rendered by the server.
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("dst demo")
    expect(spring).to_contain_text("runs 03:00 CEST (01:00 UTC)")
    expect(spring.locator(".periodic-dst-rule")).to_have_text("first valid instant")
