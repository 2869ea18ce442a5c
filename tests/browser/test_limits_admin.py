"""Concurrency limits in a real browser: a limit made on its page, named on a schedule's
form, and its list's counts of the runs holding its slots and waiting for one; a waiting
run's release says what it waits for."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule (yearly: the scheduler records no run of it while the test runs), so the
# other browser tests' schedules stay as they expect them.
SETUP = """
from django_periodic.models import Schedule
schedule = Schedule(name="limits demo", job="demo.jobs.greet", args=["limits"],
                    cron="0 0 1 1 *", timezone="UTC")
schedule.full_clean()
schedule.save()
"""

# Runs of the schedule as planning records them (held, its limit named), planned an hour
# ahead so that neither admission nor a claim takes one while the test looks: the first made
# a holder by hand (its release back), the other two waiting.
RUNS = """
from datetime import timedelta
from django.utils import timezone
from django_periodic.models import Run, Schedule
schedule = Schedule.objects.get(name="limits demo")
ahead = timezone.now() + timedelta(hours=1)
runs = [Run.for_schedule(schedule, ahead + timedelta(minutes=m), exclusive=False)
        for m in range(3)]
for run in runs:
    run.save()
Run.objects.filter(pk=runs[0].pk).update(release_at=None, held_release_at=None)
"""


def test_an_operator_limits_a_schedule_and_sees_its_holders_and_waiting_runs(
    admin_page, example_site
):
    shell = _environment(example_site.workdir), example_site.workdir, "shell", "-c"
    _manage(*shell, SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/concurrencylimit/add/")
    page.fill("#id_name", "partner api")
    page.fill("#id_max_running", "1")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("partner api")

    page.goto("/admin/django_periodic/schedule/?q=limits+demo")
    page.locator("#result_list").get_by_role("link", name="limits demo").click()
    page.select_option("#id_concurrency_limit", label="partner api")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("limits demo")

    _manage(*shell, RUNS)
    page.goto("/admin/django_periodic/concurrencylimit/")
    row = page.locator("#result_list tbody tr").filter(has_text="partner api")
    expect(row.locator(".field-max_running")).to_have_text("1")
    expect(row.locator(".field-holding")).to_have_text("1")
    expect(row.locator(".field-waiting")).to_have_text("2")

    row.get_by_role("link", name="partner api").click()
    expect(page.locator(".field-used_by")).to_contain_text("limits demo")
    expect(page.locator(".field-holders li")).to_have_count(1)
    expect(page.locator(".field-waiting_runs li")).to_have_count(2)

    page.goto("/admin/django_periodic/run/?q=limits+demo")
    releases = page.locator("#result_list tbody .field-release")
    expect(releases.filter(has_text="waiting for “partner api”")).to_have_count(2)
    expect(page.locator("#result_list")).not_to_contain_text("8999")
