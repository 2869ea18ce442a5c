"""Deleting schedules with their history in a real browser: counted, confirmed, gone."""

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Paused schedules with a history of runs, each run with a lease, added in bulk.
WITH_HISTORY = """
from datetime import timedelta
from django.utils import timezone
from django_periodic.models import Lease, Run, Schedule

now = timezone.now()
for name, runs in {names_and_runs!r}.items():
    schedule = Schedule(name=name, job="demo.jobs.greet", args=["x"], cron="0 3 * * *",
                        enabled=False)
    schedule.full_clean()
    schedule.save()
    created = Run.objects.bulk_create(
        Run(schedule=schedule, plan_time=now - timedelta(minutes=i), job_name=schedule.job,
            status="succeeded", attempt=1)
        for i in range(runs)
    )
    Lease.objects.bulk_create(
        Lease(run=run, attempt=1, holder="old:1", acquired_at=now, heartbeat_at=now,
              expires_at=now, released_at=now, outcome="succeeded")
        for run in created
    )
"""


CONFIRM = "Yes, I\u2019m sure"  # Django's button, with its typographic apostrophe


def expect(locator):
    from playwright.sync_api import expect

    return expect(locator)


def with_history(site, **names_and_runs: int) -> None:
    names = {name.replace("_", " "): runs for name, runs in names_and_runs.items()}
    site.shell(WITH_HISTORY.format(names_and_runs=names))


def history_of(page, name: str):
    """The rows of the run list for the schedule ``name``."""
    page.goto(f"/admin/django_periodic/run/?q={name.replace(' ', '+')}")
    return page.locator("#result_list tbody tr")


def test_a_superuser_deletes_a_schedule_with_its_runs(admin_page, example_site):
    with_history(example_site, old_export=1500)
    page = admin_page
    expect(history_of(page, "old export")).to_have_count(100)  # a page of them
    page.goto("/admin/django_periodic/schedule/?q=old+export")
    page.locator("#result_list tbody tr").first.locator("th a").click()
    page.locator("a.deletelink").click()

    summary = page.locator("#content ul").first
    expect(summary).to_contain_text("Schedules: 1")
    expect(summary).to_contain_text("Runs: 1,500")
    expect(summary).to_contain_text("Leases: 1,500")
    expect(page.locator("#content")).not_to_contain_text("Cannot delete")
    expect(page.locator("#deleted-objects a")).to_have_count(1)  # the schedule, not its runs
    page.get_by_role("button", name=CONFIRM).click()

    expect(page.locator(".messagelist")).to_contain_text("“old export” was deleted successfully")
    expect(history_of(page, "old export")).to_have_count(0)


def test_who_may_delete_schedules_deletes_them_with_their_history(deleter_page, example_site):
    with_history(example_site, stale_import=30, stale_billing=20)
    page = deleter_page
    page.goto("/admin/django_periodic/schedule/?q=stale")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    for row in rows.all():
        row.locator("input.action-select").check()
    page.select_option("select[name=action]", "delete_selected")
    page.click("button[name=index]")

    summary = page.locator("#content ul").first
    expect(summary).to_contain_text("Schedules: 2")
    expect(summary).to_contain_text("Runs: 50")
    expect(summary).to_contain_text("Leases: 50")
    expect(page.locator("#content")).not_to_contain_text("Cannot delete")
    page.get_by_role("button", name=CONFIRM).click()

    expect(page.locator(".messagelist")).to_contain_text("Successfully deleted 2 schedules.")
    expect(page.locator("#result_list tbody tr")).to_have_count(0)
