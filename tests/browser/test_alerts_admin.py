"""Alerts in a real browser: an operator sets a schedule's alerts on its form (a count out
of range refused on its field), and the example project's scheduler, a process of its own,
finds the schedule needing attention; the list shows why, under its filter, and the
schedule's page says so in its State fieldset."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule, with two failed fires in its history, so the other browser tests'
# schedules stay as they expect them. It fires once a year: a fire during the test would
# succeed, and its last two runs would no longer both have failed.
SETUP = """
from datetime import timedelta
from django_periodic.db import clock
from django_periodic.models import Run, Schedule
schedule = Schedule(name="alert demo", job="demo.jobs.greet", args=["alerts"],
                    cron="0 0 1 1 *", timezone="UTC")
schedule.full_clean()
schedule.save()
now = clock.now()
for minutes in (30, 20):
    Run.for_schedule(schedule, now - timedelta(minutes=minutes), status="failed",
                     error_code="ConnectionError", attempt=1).save()
"""
# The scheduler judges once a minute (ALERT_INTERVAL's default), and sooner only once some
# schedule has alerts: the longest wait is about that minute.
JUDGED_WITHIN = 90


def test_an_operator_sets_alerts_and_sees_the_schedule_needing_attention(admin_page, example_site):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/schedule/?q=alert+demo")
    page.get_by_role("link", name="alert demo").click()

    # Out of range: refused on its field, saying why.
    page.fill("#id_alert_failures", "0")
    page.click("input[name=_continue]")
    expect(page.locator(".field-alert_failures .errorlist")).to_contain_text(
        "alert_failures must be at least 1"
    )

    page.fill("#id_alert_after", "06:00:00")
    page.fill("#id_alert_failures", "2")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    expect(page.locator("#id_alert_failures")).to_have_value("2")

    # The scheduler, in its own process, finds its last two runs failed.
    page.goto("/admin/django_periodic/schedule/?attention=yes")
    row = page.locator("#result_list tbody tr").filter(has_text="alert demo")
    reload_until(
        page, row.locator(".periodic-attention"), "its last 2 run(s) failed", JUDGED_WITHIN
    )
    expect(page.locator("#changelist-filter")).to_contain_text("needs attention")

    # Its own page says so too, in the State fieldset.
    row.get_by_role("link", name="alert demo").click()
    expect(page.locator(".field-attention")).to_contain_text("its last 2 run(s) failed")
