"""Run history in a real browser: revisions tell which version of a schedule ran, and the
schedule's own retention rules are set on its form."""

import pytest

from tests.browser.test_console import choose, expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]


def run_now_and_wait(page) -> None:
    """Press Run now on a schedule's page and wait on the new run's page until it ran."""
    page.get_by_role("button", name="Run now").click()
    page.locator(".messagelist").get_by_role("link").click()
    reload_until(page, page.locator(".field-status_badge"), "succeeded")


def test_an_edited_schedules_runs_name_the_revision_that_recorded_them(admin_page):
    page = admin_page
    page.goto("/admin/django_periodic/schedule/add/")
    page.fill("#id_name", "revised greeting")
    choose(page, "job", "greet")
    page.fill("#id_args", '["Rome"]')
    page.fill("#id_cron", "0 5 * * *")
    page.fill("#id_keep_runs", "5")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    expect(page.locator(".field-revision .readonly")).to_have_text("1")
    expect(page.locator("#id_keep_runs")).to_have_value("5")

    run_now_and_wait(page)
    expect(page.locator(".field-revision_link .readonly")).to_have_text("1")
    page.locator(".field-schedule_link a").click()
    page.fill("#id_args", '["Paris"]')
    page.click("input[name=_continue]")
    expect(page.locator(".field-revision .readonly")).to_have_text("2")
    page.fill("#id_keep_runs", "6")  # a retention rule is no new revision
    page.click("input[name=_continue]")
    expect(page.locator(".field-revision .readonly")).to_have_text("2")

    run_now_and_wait(page)
    expect(page.locator(".field-result_json")).to_contain_text("Paris")
    page.locator(".field-schedule_link a").click()
    page.locator(".object-tools").get_by_role("link", name="Runs").click()
    revisions = page.locator("#result_list tbody td.field-revision_link")
    expect(revisions).to_have_text(["2", "1"])
