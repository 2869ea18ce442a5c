"""A schedule's ping URL in a real browser: an operator sets it on the form (a URL that is
not http(s) refused on its field) and sees it again; the history says it was set, not what
it is; a user who may only view the schedule gets pages without it, in their source too."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

KEY = "5c1f3b7a-2d4e-4f60-8a9b-0c1d2e3f4a5b"
URL = f"https://hc-ping.com/{KEY}"
# Its own schedule, so the other browser tests' schedules stay as they expect them. It fires
# once a year: no run (and no ping) during the test.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="pings demo", job="demo.jobs.greet", args=["pings"],
                    cron="0 0 1 1 *", timezone="UTC")
schedule.full_clean()
schedule.save()
"""


def open_schedule(page) -> None:
    page.goto("/admin/django_periodic/schedule/?q=pings+demo")
    page.get_by_role("link", name="pings demo").click()


def test_an_operator_sets_the_ping_url_and_a_viewer_never_gets_it(
    admin_page, viewer_page, example_site
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    open_schedule(page)
    page.fill("#id_ping_url", f"hc-ping.com/{KEY}")
    page.click("input[name=_continue]")
    expect(page.locator(".field-ping_url .errorlist")).to_contain_text(
        "ping_url must be an http:// or https:// URL"
    )

    page.fill("#id_ping_url", URL)
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    expect(page.locator("#id_ping_url")).to_have_value(URL)
    schedule_page = page.url

    page.locator(".object-tools").get_by_role("link", name="History").click()
    newest = page.locator("#schedule-versions tr.periodic-version").nth(0)
    expect(newest.locator(".periodic-version-changes li")).to_have_text(['ping_url: "" → (set)'])
    history_page = page.url
    assert KEY not in page.content()

    for url in (schedule_page, history_page, "/admin/django_periodic/schedule/"):
        viewer_page.goto(url)
        expect(viewer_page.locator("#content")).to_be_visible()
        expect(viewer_page.locator(".field-ping_url")).to_have_count(0)
        assert KEY not in viewer_page.content(), url
    viewer_page.goto(schedule_page)
    expect(viewer_page.locator("#content")).to_contain_text("pings demo")
