"""Backfilling missed runs from the schedule list, in a real browser, and a real scheduler
running them."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, so the other browser tests' history stays as they expect it.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="backfill demo", job="demo.jobs.greet", args=["backfill"],
                    cron="*/10 * * * *", timezone="UTC")
schedule.full_clean()
schedule.save()
"""
FORMAT = "%Y-%m-%dT%H:%M:%S"  # a datetime-local input's value, to the second


def test_an_operator_backfills_missed_runs_that_the_scheduler_then_runs(
    admin_page, example_site, screenshots
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    # The example project's TIME_ZONE is UTC: the form's times are UTC too.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    page.goto("/admin/django_periodic/schedule/?q=backfill+demo")
    page.locator("#result_list tbody tr").first.locator("input.action-select").check()
    page.select_option("select[name=action]", "backfill")
    page.click("button[name=index]")
    expect(page.locator("#backfill-schedules")).to_contain_text("backfill demo")

    # A range starting in the future is refused, and says why.
    page.fill("#id_start", (hour + timedelta(days=1)).strftime(FORMAT))
    page.fill("#id_end", (hour + timedelta(days=2)).strftime(FORMAT))
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".field-start .errorlist")).to_contain_text("is in the future")
    expect(page.locator("#backfill-preview")).to_have_count(0)

    # A past range: the preview counts the runs, then they are recorded.
    page.fill("#id_start", hour.strftime(FORMAT))
    page.fill("#id_end", (hour + timedelta(minutes=30)).strftime(FORMAT))
    page.fill("#id_rate", "20")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#backfill-preview .backfill-recorded")).to_have_text("3")
    page.screenshot(path=screenshots / "backfill.png")
    page.get_by_role("button", name="Backfill 3 runs").click()
    expect(page.locator(".messagelist")).to_contain_text(
        "Recorded 3 runs to backfill (0 plan times already had a run)"
    )

    # The example's scheduler starts them once released; the history shows them succeeded.
    page.goto("/admin/django_periodic/run/?q=backfill+demo&trigger__exact=backfill")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    for index in range(3):
        reload_until(page, rows.nth(index).locator(".periodic-badge"), "succeeded")
    expect(rows.locator("td.field-trigger")).to_have_text(["backfill"] * 3)
