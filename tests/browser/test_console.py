"""The scheduling console in a real browser, as an operator and as a view-only user."""

import re
import time
from datetime import UTC, date, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.processes]

RUN_TIMEOUT = 60  # seconds for a requested run to be executed by the example's scheduler


def expect(locator):
    from playwright.sync_api import expect

    return expect(locator)


def next_spring_forward_in_berlin(today: date) -> date:
    """The last Sunday of March (Europe/Berlin springs forward) at least a week away."""
    year = today.year
    while True:
        day = date(year, 3, 31)
        day -= timedelta(days=(day.weekday() + 1) % 7)
        if day > today + timedelta(days=7):
            return day
        year += 1


def reload_until(page, locator, text: str, timeout: float = RUN_TIMEOUT) -> None:
    """Reload until ``locator`` shows ``text``: the scheduler works in another process."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            expect(locator).to_contain_text(text, timeout=2_000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            page.reload()


def choose(page, field: str, search: str) -> None:
    """Pick an option of a searchable select (select2) by typing, as a person does."""
    page.locator(f".field-{field} .select2-selection").click()
    page.locator(".select2-search__field").fill(search)
    page.keyboard.press("Enter")


def test_an_operator_creates_a_cron_schedule_and_runs_it(admin_page, screenshots):
    page = admin_page
    preview = page.locator("#periodic-preview")
    page.goto("/admin/django_periodic/schedule/add/")
    page.fill("#id_name", "nightly report")
    choose(page, "job", "greet")
    expect(page.locator("#id_job")).to_have_value("demo.jobs.greet")
    page.fill("#id_args", '["Berlin"]')

    # Only the chosen kind's field is shown.
    expect(page.locator(".field-cron")).to_be_visible()
    expect(page.locator(".field-interval")).to_be_hidden()
    page.check("input[name=trigger_kind][value=interval]")
    expect(page.locator(".field-interval")).to_be_visible()
    expect(page.locator(".field-cron")).to_be_hidden()
    page.check("input[name=trigger_kind][value=cron]")
    expect(page.locator(".field-max_queued")).to_be_hidden()  # only with overlap "queue"
    page.select_option("#id_overlap", "queue")
    expect(page.locator(".field-max_queued")).to_be_visible()
    page.select_option("#id_overlap", "skip")

    # A bad field is named on the field, as it is typed and by the form on save.
    bad_field = "Invalid day-of-week field '8': 8 is out of range 0-7."
    errors = page.locator(".field-cron .errorlist")
    page.locator("#id_cron").press_sequentially("30 2 * * 8")
    expect(errors).to_have_text(bad_field)
    expect(preview).to_contain_text(bad_field)
    page.click("input[name=_continue]")
    expect(page.locator(".errornote")).to_be_visible()
    expect(errors).to_have_text(bad_field)

    # The preview follows the typing: words, then the wall clock of the chosen zone.
    page.fill("#id_cron", "")
    page.locator("#id_cron").press_sequentially("30 2 * * *")
    expect(preview).to_contain_text("At 02:30")
    expect(errors).to_have_count(0)  # the field's message goes once the field is right
    expect(preview.locator("tbody tr")).to_have_count(10)
    choose(page, "timezone", "Europe/Berl")
    expect(preview.locator("thead")).to_contain_text("Europe/Berlin")
    expect(preview.locator("tbody tr").first).to_contain_text("02:30 CE")
    spring = next_spring_forward_in_berlin(datetime.now(UTC).date())
    page.fill("#id_start_at_0", (spring - timedelta(days=3)).isoformat())
    page.fill("#id_start_at_1", "00:00:00")
    page.locator("#id_start_at_1").dispatch_event("change")
    flagged = preview.locator("tr.periodic-dst")
    expect(flagged).to_contain_text("daylight saving time starts: UTC+01:00 → UTC+02:00")
    expect(flagged).to_contain_text(f"{spring.isoformat()} 03:00 CEST")  # 02:30 does not exist
    page.locator(".field-cron").evaluate("row => row.closest('fieldset').scrollIntoView()")
    page.screenshot(path=screenshots / "schedule-form.png")

    # Saved: the page keeps the preview.
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    expect(preview).to_contain_text("At 02:30, from")
    expect(preview.locator("tr.periodic-dst")).to_have_count(1)

    # Run now: a scheduler process runs it; its page shows the outcome and the lease.
    page.get_by_role("button", name="Run now").click()
    message = page.locator(".messagelist")
    expect(message).to_contain_text("Requested a run: demo.jobs.greet")
    message.get_by_role("link").click()
    reload_until(page, page.locator(".field-status_badge"), "succeeded")
    expect(page.locator(".field-result_json")).to_contain_text('"Hello, Berlin!"')
    lease = page.locator("#leases-group tbody tr.has_original")
    expect(lease).to_have_count(1)
    expect(lease.locator("td.field-outcome")).to_have_text("succeeded")
    expect(lease.locator("td.field-holder")).to_contain_text(":")

    # ...and the schedule's run history lists it.
    page.locator(".field-schedule_link a").click()
    page.locator(".object-tools").get_by_role("link", name="Runs").click()
    row = page.locator("#result_list tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator(".periodic-badge")).to_have_text("succeeded")
    expect(row.locator("td.field-trigger")).to_have_text("manual")


def test_a_failed_run_shows_its_error_and_can_be_retried(admin_page, screenshots):
    page = admin_page
    page.goto("/admin/django_periodic/schedule/?q=export")
    page.locator("#result_list tbody tr").first.locator("input.action-select").check()
    page.select_option("select[name=action]", "run_now")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("Requested 1 run: 1 pending.")

    page.goto("/admin/django_periodic/run/?q=export")
    reload_until(page, page.locator("#result_list tbody tr").first, "failed")
    page.locator("#result_list tbody tr").first.locator("th a").click()
    expect(page.locator(".field-error_code")).to_contain_text("ConnectionRefusedError")
    expect(page.locator(".field-error_message")).to_contain_text("refused the connection")
    expect(page.locator(".field-traceback_text pre")).to_contain_text("in _upload")
    lease = page.locator("#leases-group tbody tr.has_original")
    expect(lease.locator("td.field-outcome")).to_have_text("failed")
    page.screenshot(path=screenshots / "failed-run.png", full_page=True)

    page.get_by_role("button", name="Retry").click()
    expect(page.locator(".messagelist")).to_contain_text("Retrying as a new run")
    expect(page.locator(".field-trigger")).to_contain_text("retry")


def test_the_schedule_list_shows_status_and_recent_runs(admin_page, screenshots):
    page = admin_page
    page.set_viewport_size({"width": 1800, "height": 1000})
    page.goto("/admin/django_periodic/schedule/")
    page.click("#toggle-nav-sidebar")  # room for every column
    rows = page.locator("#result_list tbody tr")
    expect(rows.filter(has_text="demo.jobs.tidy_sessions")).to_contain_text("Every minute")
    export = rows.filter(has_text="export to partner")
    reload_until(page, export.locator(".periodic-badge"), "failed")
    expect(export.locator("a.periodic-square").first).to_have_attribute(
        "href", re.compile(r"/admin/django_periodic/run/\d+/change/")
    )
    expect(rows.filter(has_text="hourly sync").locator("a.periodic-square")).to_have_count(20)
    broken = rows.filter(has_text="import orders").locator(".periodic-error")
    reload_until(page, broken, "no live process has had its job 'demo.jobs.import_orders'")
    page.screenshot(path=screenshots / "schedule-list.png", full_page=True)


def test_a_viewer_sees_everything_and_no_action(viewer_page):
    page = viewer_page
    page.goto("/admin/django_periodic/schedule/")
    expect(page.locator("#result_list tbody tr").first).to_be_visible()
    expect(page.locator("select[name=action]")).to_have_count(0)
    page.locator("#result_list tbody tr", has_text="export to partner").locator("th a").click()
    expect(page.locator("#periodic-preview")).to_contain_text("At 06:00")
    expect(page.locator("#id_cron")).to_have_count(0)
    expect(page.get_by_role("button", name="Run now")).to_have_count(0)
    expect(page.locator("input[type=submit]")).to_have_count(0)

    page.goto("/admin/django_periodic/run/?status__exact=failed")
    reload_until(page, page.locator("#result_list"), "failed")  # the one run at set-up
    expect(page.locator("select[name=action]")).to_have_count(0)
    page.locator("#result_list tbody tr").first.locator("th a").click()
    expect(page.locator(".field-error_code")).to_be_visible()
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)


def test_the_preview_posts_what_is_typed_and_no_argument_reaches_a_url(admin_page):
    page = admin_page
    requests = []
    page.on("request", lambda request: requests.append(request))

    def previews():
        return [r for r in requests if "/schedule/preview/" in r.url]

    preview = page.locator("#periodic-preview")

    # A new schedule: the whole form goes in the body, with the form's CSRF token.
    page.goto("/admin/django_periodic/schedule/add/")
    page.fill("#id_name", "token rotation")
    choose(page, "job", "greet")
    page.fill("#id_args", '["s3cr3t-token"]')
    page.locator("#id_cron").press_sequentially("15 4 * * *")
    expect(preview).to_contain_text("At 04:15")
    expect(preview.locator("tbody tr")).to_have_count(10)
    posted = previews()
    assert posted and {r.method for r in posted} == {"POST"}
    assert {urlsplit(r.url).query for r in posted} == {""}
    assert "s3cr3t-token" in posted[-1].post_data
    assert "csrfmiddlewaretoken=" in posted[-1].post_data

    # A saved schedule: its id in the URL, nothing typed.
    requests.clear()
    page.goto("/admin/django_periodic/schedule/?q=hourly+sync")
    page.locator("#result_list tbody tr").first.locator("th a").click()
    page.fill("#id_args", '["an0ther-s3cr3t"]')
    page.fill("#id_cron", "")
    page.locator("#id_cron").press_sequentially("45 * * * *")
    expect(preview).to_contain_text("At 45 minutes past the hour")
    expect(preview.locator("tbody tr")).to_have_count(10)
    posted = previews()
    assert posted and {r.method for r in posted} == {"POST"}
    assert {tuple(parse_qs(urlsplit(r.url).query)) for r in posted} == {("object_id",)}
    assert not [r.url for r in requests if "s3cr3t" in r.url]
