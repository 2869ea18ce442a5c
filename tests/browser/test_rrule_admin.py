"""An RRULE schedule in a real browser: the operator picks the kind, types a rule, sees the
live preview list its fires (and a bad rule named on its field), saves it, and finds it
under the kind filter."""

import pytest

from tests.browser.test_console import choose, expect

pytestmark = [pytest.mark.browser, pytest.mark.processes]

LAST_WORKING_DAY = "RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1"


def test_an_operator_creates_an_rrule_schedule_and_sees_its_preview(admin_page, screenshots):
    page = admin_page
    preview = page.locator("#periodic-preview")
    page.goto("/admin/django_periodic/schedule/add/")
    page.fill("#id_name", "month-end close")
    choose(page, "job", "greet")
    page.fill("#id_args", '["month end"]')
    page.check("input[name=trigger_kind][value=rrule]")
    expect(page.locator(".field-rrule")).to_be_visible()
    expect(page.locator(".field-cron")).to_be_hidden()
    choose(page, "timezone", "Europe/Par")
    # start_at is an instant in the site's time zone (UTC here): 09:00 on Paris's clock.
    page.fill("#id_start_at_0", "2027-01-01")
    page.fill("#id_start_at_1", "08:00:00")
    page.locator("#id_start_at_1").dispatch_event("change")

    # A bad rule is named on its field as it is typed.
    errors = page.locator(".field-rrule .errorlist")
    page.locator("#id_rrule").press_sequentially("FREQ=FORTNIGHTLY")
    expect(errors).to_contain_text("Invalid RRULE 'FREQ=FORTNIGHTLY'")

    # The last working day of each month, at start_at's time on Paris's wall clock.
    page.fill("#id_rrule", "")
    page.locator("#id_rrule").press_sequentially(LAST_WORKING_DAY)
    expect(errors).to_have_count(0)
    expect(preview).to_contain_text("RRULE " + LAST_WORKING_DAY)
    rows = preview.locator("tbody tr")
    expect(rows).to_have_count(10)
    expect(rows.nth(0)).to_contain_text("Fri 2027-01-29 09:00 CET")  # the 31st is a Sunday
    expect(rows.nth(1)).to_contain_text("Fri 2027-02-26 09:00 CET")
    expect(rows.nth(2)).to_contain_text("Wed 2027-03-31 09:00 CEST")
    page.locator(".field-rrule").evaluate("row => row.closest('fieldset').scrollIntoView()")
    page.screenshot(path=screenshots / "rrule-preview.png")

    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    expect(rows.nth(0)).to_contain_text("Fri 2027-01-29 09:00 CET")
    page.goto("/admin/django_periodic/schedule/?kind=rrule")
    expect(page.locator("#result_list")).to_contain_text("month-end close")
