"""A schedule's versions in a real browser: an edit saved with a reason is a version whose
diff, author and reason its history page shows, and "Restore this version" brings the old
fields back as a new version."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule, changed_by
schedule = Schedule(name="versions demo", job="demo.jobs.greet", args=["versions"],
                    cron="*/10 * * * *", timezone="UTC")
schedule.full_clean()
with changed_by("setup", "the first version"):
    schedule.save()
"""


def open_schedule(page) -> None:
    page.goto("/admin/django_periodic/schedule/?q=versions+demo")
    page.get_by_role("link", name="versions demo").click()


def test_an_edit_with_a_reason_shows_its_diff_in_the_history_and_restores(
    admin_page, viewer_page, example_site
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    open_schedule(page)
    page.fill("#id_cron", "0 7 * * *")
    page.fill("#id_version_reason", "after the nightly backup")
    page.click("input[name=_continue]")
    page.locator("input[name=_save_confirmed]").click()  # the diff of its fires, confirmed
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    expect(page.locator(".field-revision .readonly")).to_have_text("2")

    page.locator(".object-tools").get_by_role("link", name="History").click()
    rows = page.locator("#schedule-versions tr.periodic-version")
    expect(rows).to_have_count(2)
    newest, first = rows.nth(0), rows.nth(1)
    expect(newest.locator(".periodic-version-by")).to_have_text("admin")
    expect(newest.locator(".periodic-version-reason")).to_have_text("after the nightly backup")
    expect(newest.locator(".periodic-version-changes li")).to_have_text(
        ["cron: */10 * * * * → 0 7 * * *"]
    )
    expect(first.locator(".periodic-version-reason")).to_have_text("the first version")
    expect(newest.get_by_role("button", name="Restore this version")).to_have_count(0)

    # A viewer sees the history, but no button to restore.
    viewer_page.goto(page.url)
    expect(viewer_page.locator("#schedule-versions tr.periodic-version")).to_have_count(2)
    expect(viewer_page.get_by_role("button", name="Restore this version")).to_have_count(0)

    first.get_by_role("button", name="Restore this version").click()
    expect(page.locator(".messagelist")).to_contain_text("Restored the version of revision 1.")
    expect(rows).to_have_count(3)
    restored = rows.nth(0)
    expect(restored.locator(".periodic-version-reason")).to_contain_text("Restored revision 1")
    expect(restored.locator(".periodic-version-changes li")).to_have_text(
        ["cron: 0 7 * * * → */10 * * * *"]
    )
    open_schedule(page)
    expect(page.locator("#id_cron")).to_have_value("*/10 * * * *")
    expect(page.locator(".field-revision .readonly")).to_have_text("3")
