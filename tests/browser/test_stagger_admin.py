"""A staggered run in a real browser: the run list and the run's page show its plan time
and its release time, and its lag counts from the release."""

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedule and one run released 4 min 10 s after its plan time, started 2 s later.
SETUP = """
from datetime import UTC, datetime, timedelta
from django_periodic.models import Run, Schedule
schedule = Schedule(name="stagger demo", job="demo.jobs.greet", args=["stagger"],
                    cron="0 3 * * *", timezone="UTC", jitter=timedelta(minutes=10))
schedule.full_clean()
schedule.save()
plan = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
release = plan + timedelta(minutes=4, seconds=10)
Run.objects.create(schedule=schedule, plan_time=plan, release_at=release, attempt=1,
                   status="succeeded", started_at=release + timedelta(seconds=2),
                   finished_at=release + timedelta(seconds=3), job_name=schedule.job)
"""


def test_a_staggered_run_shows_its_plan_time_and_its_release(admin_page, example_site):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/run/?q=stagger+demo")
    row = page.locator("#result_list tbody tr").filter(has_text="stagger demo")
    expect(row.locator(".field-plan")).to_contain_text("2026-03-02 03:00:00")
    expect(row.locator(".field-release")).to_contain_text("2026-03-02 03:04:10")
    expect(row.locator(".field-lag")).to_contain_text("2.0 s")  # from the release

    row.locator(".field-plan a").click()
    expect(page.locator(".field-plan")).to_contain_text("2026-03-02 03:00:00")
    expect(page.locator(".field-release")).to_contain_text("2026-03-02 03:04:10")
    expect(page.locator(".field-lag")).to_contain_text("2.0 s")
