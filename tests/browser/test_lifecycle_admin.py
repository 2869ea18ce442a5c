"""A schedule's lifecycle in a real browser: an operator sets its Lifecycle fieldset (a
count out of range refused on its field); the example project's scheduler, a process of
its own, pauses it after its failures in a row, and the list says "until resumed"; a
schedule that has run its max_runs fires shows that it has ended."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedules, so the other browser tests' stay as they expect them. They fire once a
# year: a fire during the test would succeed and end the failures in a row.
SETUP = """
from django_periodic.models import Schedule
for name in ("lifecycle demo", "ended demo"):
    schedule = Schedule(name=name, job="demo.jobs.greet", args=["lifecycle"],
                        cron="0 0 1 1 *", timezone="UTC")
    schedule.full_clean()
    schedule.save()
# Ended as the planner ends one: its fires counted up to max_runs, no next fire.
Schedule.objects.filter(name="ended demo").update(max_runs=2, fire_count=2, next_fire_at=None)
"""
# Two failed runs planned after the operator's save (a save gives the threshold afresh).
FAILURES = """
from datetime import timedelta
from django_periodic.db import clock
from django_periodic.models import Run, Schedule
schedule = Schedule.objects.get(name="lifecycle demo")
after = max(clock.now(), schedule.updated_at)
for seconds in (1, 2):
    Run.for_schedule(schedule, after + timedelta(seconds=seconds), status="failed",
                     error_code="ConnectionError", attempt=1).save()
"""
# The scheduler judges once a minute (ALERT_INTERVAL's default), and sooner only once some
# schedule may pause itself: the longest wait is about that minute.
JUDGED_WITHIN = 90


def test_an_operator_sets_the_lifecycle_and_sees_the_schedule_pause_and_end(
    admin_page, example_site
):
    env = _environment(example_site.workdir)
    _manage(env, example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/schedule/?q=lifecycle+demo")
    page.get_by_role("link", name="lifecycle demo").click()

    page.fill("#id_pause_after_failures", "0")
    page.click("input[name=_continue]")
    expect(page.locator(".field-pause_after_failures .errorlist")).to_contain_text(
        "pause_after_failures must be at least 1"
    )

    page.fill("#id_max_runs", "10")
    page.fill("#id_pause_after_failures", "2")
    page.check("#id_fire_on_create")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    expect(page.locator("#id_max_runs")).to_have_value("10")
    expect(page.locator("#id_pause_after_failures")).to_have_value("2")
    expect(page.locator("#id_fire_on_create")).to_be_checked()
    expect(page.locator(".field-fires")).to_contain_text("0 of 10 runs")

    # The scheduler, in its own process, pauses it after its two failed runs.
    _manage(env, example_site.workdir, "shell", "-c", FAILURES)
    page.goto("/admin/django_periodic/schedule/?q=lifecycle+demo")
    row = page.locator("#result_list tbody tr").filter(has_text="lifecycle demo")
    reload_until(page, row.locator(".periodic-paused"), "paused until resumed", JUDGED_WITHIN)
    row.get_by_role("link", name="lifecycle demo").click()
    expect(page.locator(".field-pause_state")).to_contain_text("paused until resumed")
    expect(page.locator(".field-pause_state")).to_contain_text("2 failed runs in a row")

    page.goto("/admin/django_periodic/schedule/?q=ended+demo")
    row = page.locator("#result_list tbody tr").filter(has_text="ended demo")
    expect(row.locator(".field-next_fire")).to_contain_text("ended: ran 2 of 2 runs")
    expect(row.locator(".field-fires")).to_contain_text("ended: ran 2 of 2 runs")
