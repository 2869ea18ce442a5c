"""Skipping and moving single fires from a schedule's page, in a real browser: the next
fires' "Skip…" and "Move…", a refused move saying why, and the preview and the list of
overrides showing what became of each fire."""

from datetime import datetime, timedelta

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' schedules stay as they expect them; made
# once for both tests (the site is the session's).
SETUP = """
from django_periodic.models import Schedule
if not Schedule.objects.filter(name="override demo").exists():
    schedule = Schedule(name="override demo", job="demo.jobs.greet", args=["override"],
                        cron="0 * * * *", timezone="UTC")
    schedule.full_clean()
    schedule.save()
"""
FORMAT = "%Y-%m-%dT%H:%M:%S"  # a datetime-local input's value, to the second


def open_schedule(page) -> None:
    page.goto("/admin/django_periodic/schedule/?q=override+demo")
    page.get_by_role("link", name="override demo").click()


def fire_row(page, index: int):
    return page.locator("#periodic-overrides tr.periodic-upcoming-fire").nth(index)


def fire_time(page, index: int) -> datetime:
    """The UTC time of the schedule's next fire number ``index``, as its page lists it."""
    text = fire_row(page, index).locator("td").first.inner_text().strip()
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def test_an_operator_skips_one_fire_and_moves_another_from_the_schedules_page(
    admin_page, example_site
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    open_schedule(page)
    skipped, moved = fire_time(page, 1), fire_time(page, 2)

    fire_row(page, 1).get_by_role("link", name="Skip…").click()
    expect(page.locator("#override-fire")).to_contain_text(skipped.strftime("%Y-%m-%d %H:%M"))
    page.fill("#id_reason", "bank holiday")
    page.get_by_role("button", name="Skip it").click()
    expect(page.locator(".messagelist")).to_contain_text("skipped by admin: bank holiday")

    # A move past the next fire is refused, on its field, and changes nothing.
    fire_row(page, 2).get_by_role("link", name="Move…").click()
    page.fill("#id_move_to", (moved + timedelta(hours=1)).strftime(FORMAT))
    page.fill("#id_reason", "after the load")
    page.get_by_role("button", name="Move it").click()
    expect(page.locator(".field-move_to .errorlist")).to_contain_text("before the fire after it")

    # The example project's TIME_ZONE is UTC: the form's times are UTC too.
    to = moved + timedelta(minutes=20)
    page.fill("#id_move_to", to.strftime(FORMAT))
    page.get_by_role("button", name="Move it").click()
    expect(page.locator(".messagelist")).to_contain_text("moved to")

    # The page lists both overrides, read back from the database, and the preview marks
    # the fires: the skipped one struck through, the moved one with its new time.
    overrides = page.locator("#periodic-overrides tr.periodic-override")
    expect(overrides).to_have_count(2)
    expect(overrides.filter(has_text="bank holiday")).to_contain_text("skipped")
    expect(overrides.filter(has_text="after the load")).to_contain_text(
        f"moved to {to:%Y-%m-%d %H:%M:%S}"
    )
    preview = page.locator("#periodic-preview tr.periodic-overridden")
    expect(preview).to_have_count(2)
    expect(preview.nth(0).locator("s")).to_have_count(1)
    expect(preview.nth(0)).to_contain_text("skipped by admin: bank holiday")
    expect(preview.nth(1).locator("s")).to_have_count(0)
    expect(preview.nth(1)).to_contain_text(f"moved to {to:%Y-%m-%d %H:%M:%S}")
    expect(fire_row(page, 1).get_by_role("link", name="Skip…")).to_have_count(0)

    page.get_by_role("link", name="History").click()
    expect(page.locator("#change-history")).to_contain_text("skipped by admin: bank holiday")


def test_a_viewer_sees_the_overrides_but_no_skip_or_move(viewer_page, example_site):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    open_schedule(viewer_page)
    expect(viewer_page.locator("#periodic-overrides tr.periodic-upcoming-fire")).to_have_count(10)
    expect(viewer_page.locator("#periodic-overrides a.periodic-skip-fire")).to_have_count(0)
