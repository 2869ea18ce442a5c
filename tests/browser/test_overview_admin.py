"""The overview page in a real browser: linked from the app's page, its sections filled by
the example's scheduler and a day of history, its SVG charts titled, and readable in dark
mode (the admin's colours follow prefers-color-scheme); screenshots in light and dark."""

import re

import pytest

from tests.browser.conftest import _environment, _manage
from tests.browser.test_console import expect, reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# Its own schedules, so the other browser tests' schedules stay as they expect them: a long
# job run now (running while the page is looked at), a feed whose job always fails, with a
# day of history every 15 minutes, and a rollup with an hour of history every minute.
SETUP = """
import random
from datetime import timedelta
from django.utils import timezone
from django_periodic.models import Run, Schedule

random.seed(33)
now = timezone.now()

def schedule(**fields):
    created = Schedule(**fields)
    created.full_clean()
    created.save()
    return created

load = schedule(name="warehouse load", job="demo.jobs.slow_report", kwargs={"seconds": 120},
                cron="0 2 * * *", timezone="Europe/Berlin")
load.run_now()
feed = schedule(name="partner feed", job="demo.jobs.export_to_partner", cron="*/15 * * * *",
                alert_failures=3)
rollup = schedule(name="metrics rollup", job="demo.jobs.greet", args=["rollup"],
                  cron="* * * * *")

def history(schedule, every, count, failing):
    start = now.replace(second=0, microsecond=0)
    start -= timedelta(minutes=start.minute % (every.seconds // 60))
    runs = []
    for k in range(1, count + 1):
        plan = start - every * k
        lag = timedelta(milliseconds=random.randint(*((20, 300) if k % 11 else (1500, 4000))))
        took = timedelta(milliseconds=random.randint(*((50, 900) if k % 7 else (3000, 9000))))
        failed = failing(k)
        runs.append(Run(
            schedule=schedule, plan_time=plan, job_name=schedule.job, args=schedule.args,
            kwargs=schedule.kwargs, attempt=1, started_at=plan + lag,
            finished_at=plan + lag + took, duration=took,
            status="failed" if failed else "succeeded",
            error_code="ConnectionError" if failed else "",
            error_message="the partner's API timed out" if failed else "",
        ))
    Run.objects.bulk_create(runs)

history(feed, timedelta(minutes=15), 96, lambda k: k <= 3 or k in (17, 40))
history(rollup, timedelta(minutes=1), 60, lambda k: k == 23)
Schedule.objects.filter(pk=feed.pk).update(
    attention_reason="failing", attention_since=now - timedelta(minutes=45)
)
"""

CHARTS = {
    "lag-hour": "Start lag, last hour (p50, p99)",
    "runs-hour": "Runs per minute, last hour",
    "lag-day": "Start lag, last day (p50, p99)",
    "runs-day": "Runs per minute, last day (hourly mean)",
}


def luminance(css: str) -> float:
    """WCAG's relative luminance of an "rgb(r, g, b)" colour."""
    channels = [int(n) / 255 for n in re.findall(r"\d+", css)[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(one: str, other: str) -> float:
    lighter, darker = sorted((luminance(one), luminance(other)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def style(page, selector: str, prop: str) -> str:
    return page.locator(selector).first.evaluate(f"e => getComputedStyle(e).{prop}")


def test_the_overview_shows_what_runs_fails_and_fires_in_light_and_dark(
    admin_page, example_site, screenshots
):
    _manage(_environment(example_site.workdir), example_site.workdir, "shell", "-c", SETUP)
    page = admin_page
    page.goto("/admin/django_periodic/")
    page.locator("#periodic-overview-link").get_by_role("link", name="Overview").click()
    expect(page.locator("h1")).to_have_text("Overview")
    reload_until(page, page.locator("#overview-running"), "warehouse load")
    failed = page.locator("#overview-failed")
    expect(failed).to_contain_text("partner feed")
    expect(failed).to_contain_text("ConnectionError")
    expect(page.locator("#overview-attention")).to_contain_text("partner feed")
    for chart_id, title in CHARTS.items():
        expect(page.locator(f"svg#{chart_id} > title")).to_have_text(title)
        expect(page.locator(f"svg#{chart_id}")).to_be_visible()
        # Its title is shown above it too, not only to screen readers and on hover.
        caption = page.locator("figure.periodic-chart-figure", has=page.locator(f"svg#{chart_id}"))
        expect(caption.locator("figcaption")).to_have_text(title)
    rollup = page.locator("#overview-schedules tr", has_text="metrics rollup")
    expect(rollup.locator("svg.periodic-runs rect")).to_have_count(50)
    expect(rollup.locator("svg.periodic-timeline rect.periodic-fire")).to_have_count(100)
    expect(rollup.locator("svg.periodic-timeline rect.periodic-fire-band")).to_have_count(1)
    # A cell's tooltip names its run, its outcome and its duration.
    expect(rollup.locator("svg.periodic-runs title").last).to_have_text(
        re.compile(r"#\d+ · (succeeded|failed|running) · [\d-]+ [\d:]+( · [\d.]+ (ms|s))?")
    )
    page.click("#toggle-nav-sidebar")  # room for the strips and timelines
    page.screenshot(path=screenshots / "overview.png", full_page=True)

    page.emulate_media(color_scheme="dark")
    page.reload()
    background = style(page, "body", "backgroundColor")
    assert luminance(background) < 0.05, background  # the admin's dark theme applies
    for selector, prop in [
        (".periodic-chart-label", "fill"),
        ("polyline.periodic-chart-p50", "stroke"),
        (".periodic-chart-bar", "fill"),
        (".periodic-cell-failed", "fill"),
        ("#overview-schedules a", "color"),
    ]:
        colour = style(page, selector, prop)
        assert contrast(colour, background) >= 3, (selector, colour, background)
    page.screenshot(path=screenshots / "overview-dark.png", full_page=True)


def test_a_viewer_sees_the_overview_and_one_who_may_not_view_runs_does_not(
    viewer_page, deleter_page
):
    viewer_page.goto("/admin/django_periodic/schedule/")
    viewer_page.get_by_role("link", name="Overview").click()
    expect(viewer_page.locator("#overview-charts")).to_be_visible()
    response = deleter_page.goto("/admin/django_periodic/schedule/overview/")
    assert response.status == 403
    deleter_page.goto("/admin/django_periodic/")
    expect(deleter_page.locator("#periodic-overview-link")).to_have_count(0)
