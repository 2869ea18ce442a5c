"""A cron schedule's DST choice in the admin: on the form (a cron's only), and in the
preview, which lists each DST change of the next two years that skips or repeats one of its
wall times, with the rule applied and what runs."""

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from django_periodic.admin import preview
from django_periodic.db import clock
from django_periodic.models import Schedule
from tests.factories import ScheduleFactory, schedule_form_data

pytestmark = pytest.mark.django_db

ADD_URL = reverse("admin:django_periodic_schedule_add")
PREVIEW_URL = reverse("admin:django_periodic_schedule_preview")
BERLIN = ZoneInfo("Europe/Berlin")
# The time the preview is asked about, where it takes one (the page reads the clock).
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def berlin_changes() -> list[tuple[date, bool]]:
    """Berlin's DST changes in the two years from the database's clock, found day by day
    (not as the preview finds them): each day, and whether clocks go forward."""
    today = clock.now().astimezone(BERLIN).date()
    changes = []
    for offset in range(2 * 366):
        day = today + timedelta(days=offset)
        before, after = (
            datetime.combine(day + timedelta(days=d), time(12), BERLIN).utcoffset() for d in (-1, 0)
        )
        if before != after and day <= today.replace(year=today.year + 2):
            changes.append((day, after > before))
    return changes


def day_label(day: date) -> str:
    return f"{day:%a %Y-%m-%d}"


def nightly(**fields) -> dict:
    values = {"name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    return schedule_form_data(**{**values, **fields})


def field_errors(response) -> dict:
    return response.context["adminform"].form.errors


def test_a_cron_schedule_saves_its_dst_choice(admin_client):
    response = admin_client.post(ADD_URL, nightly(dst_gap="skip", dst_repeat="both"))
    assert response.status_code == 302, field_errors(response)
    schedule = Schedule.objects.get(name="nightly")
    assert (schedule.dst_gap, schedule.dst_repeat) == ("skip", "both")


@pytest.mark.parametrize(
    ("kind", "trigger"),
    [
        ("interval", {"interval": "01:00:00"}),
        ("once", {"run_at_0": "2030-01-02", "run_at_1": "03:04"}),
    ],
)
@pytest.mark.parametrize("choice", [{"dst_gap": "first_valid"}, {"dst_repeat": "once"}])
def test_an_interval_or_one_shot_refuses_a_dst_choice_on_its_field(
    admin_client, kind, trigger, choice
):
    response = admin_client.post(ADD_URL, nightly(trigger_kind=kind, cron="", **trigger, **choice))
    assert response.status_code == 200
    (name,) = choice
    assert field_errors(response) == {name: [f"{name} applies to cron and RRULE triggers only."]}
    assert not Schedule.objects.exists()


GAP = {  # the choice: (the rule named, what runs on the spring-forward days)
    "": ("cron(8) default (first valid instant)", "runs 03:00 CEST (01:00 UTC)"),
    "skip": ("skip", "not run"),
    "first_valid": ("first valid instant", "runs 03:00 CEST (01:00 UTC)"),
}
REPEAT = {  # the choice: (the rule named, what runs on the fall-back days)
    "": ("cron(8) default (once)", "runs 02:30 CEST (00:30 UTC)"),
    "once": ("once", "runs 02:30 CEST (00:30 UTC)"),
    "both": ("both", "runs 02:30 CEST (00:30 UTC), 02:30 CET (01:30 UTC)"),
}


@pytest.mark.parametrize("gap", GAP)
@pytest.mark.parametrize("repeat", REPEAT)
def test_the_live_preview_lists_the_changes_with_the_typed_rule_applied(admin_client, gap, repeat):
    typed = {"trigger_kind": "cron", "cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    payload = admin_client.post(PREVIEW_URL, {**typed, "dst_gap": gap, "dst_repeat": repeat})
    changes = payload.json()["dst_changes"]
    expected = berlin_changes()
    assert [change["date"] for change in changes] == [day_label(day) for day, _ in expected]
    spring = next(c for c, (_, forward) in zip(changes, expected, strict=True) if forward)
    fall = next(c for c, (_, forward) in zip(changes, expected, strict=True) if not forward)
    assert spring["change"] == "daylight saving time starts: UTC+01:00 → UTC+02:00"
    assert spring["walls"] == "02:30 does not exist"
    assert (spring["rule"], spring["result"]) == GAP[gap]
    assert fall["change"] == "daylight saving time ends: UTC+02:00 → UTC+01:00"
    assert fall["walls"] == "02:30 happens twice"
    assert (fall["rule"], fall["result"]) == REPEAT[repeat]
    skipped = gap == "skip"
    spring_day = next(day for day, forward in expected if forward)
    at_change = f"{spring_day.isoformat()}T01:00:00+00:00"  # 03:00 CEST, the first valid
    assert [f["utc"] for f in spring["fires"]] == ([] if skipped else [at_change])
    html = payload.json()["html"]
    assert html.count('class="periodic-dst-change"') == len(expected)
    assert GAP[gap][1] in html and REPEAT[repeat][1] in html


def test_a_saved_schedules_page_and_its_preview_show_its_stored_then_its_typed_choice(admin_client):
    schedule = ScheduleFactory(
        interval=None, cron="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip"
    )
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    html = page.content.decode()
    assert 'id="periodic-dst-changes"' in html
    springs = sum(forward for _, forward in berlin_changes())
    assert html.count('<span class="periodic-dst-result">not run</span>') == springs
    typed = {"trigger_kind": "cron", "cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    url = f"{PREVIEW_URL}?object_id={schedule.pk}"
    changes = admin_client.post(url, {**typed, "dst_gap": "first_valid"}).json()["dst_changes"]
    assert changes[0]["result"] == "runs 03:00 CEST (01:00 UTC)"
    schedule.refresh_from_db()
    assert schedule.dst_gap == "skip"  # a preview never saves


def test_a_choice_on_an_interval_is_named_on_its_field_by_the_live_preview(admin_client):
    typed = {
        "trigger_kind": "interval",
        "interval": "01:00:00",
        "timezone": "UTC",
        "dst_gap": "skip",
    }
    payload = admin_client.post(PREVIEW_URL, typed).json()
    assert payload["errors"] == {"dst_gap": ["dst_gap applies to cron and RRULE triggers only."]}
    assert payload["dst_changes"] == []


def test_many_wall_times_read_as_a_range_and_the_fires_are_cut_short():
    every_minute = Schedule(cron="* * * * *", timezone="Europe/Berlin")
    fall = preview.preview(every_minute, NOW).dst.changes[1]
    assert fall.walls() == "02:00, 02:01, 02:02 … 02:59 happen twice"
    assert fall.rule() == "cron(8) default (both)"
    assert fall.result() == (
        "runs 02:00 CEST (00:00 UTC), 02:01 CEST (00:01 UTC), 02:02 CEST (00:02 UTC), …"
    )


def test_a_schedule_no_change_touches_says_so_and_others_list_nothing():
    noon = preview.preview(Schedule(cron="0 12 * * *", timezone="Europe/Berlin"), NOW)
    assert noon.dst.changes == []
    assert "No daylight saving time change in the next two years" in " ".join(noon.notes)
    for schedule in (
        Schedule(cron="30 2 * * *", timezone="UTC"),  # a zone without changes
        Schedule(interval=timedelta(hours=1), timezone="Europe/Berlin", created_at=NOW),
    ):
        result = preview.preview(schedule, NOW)
        assert result.fires and result.dst.changes == [] and not result.notes


def test_the_45_minute_zone_is_listed_with_its_offsets():
    chatham = Schedule(cron="50 2 * * *", timezone="Pacific/Chatham", dst_gap="skip")
    spring = [c for c in preview.preview(chatham, NOW).dst.changes if "starts" in c.offsets()]
    assert spring[0].date() == "Sun 2026-09-27"
    assert spring[0].offsets() == "daylight saving time starts: UTC+12:45 → UTC+13:45"
    assert (spring[0].walls(), spring[0].result()) == ("02:50 does not exist", "not run")


def test_start_and_end_bound_the_changes_listed():
    bounded = Schedule(
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        start_at=datetime(2026, 6, 1, tzinfo=UTC),
        end_at=datetime(2027, 6, 1, tzinfo=UTC),
    )
    dates = [change.date() for change in preview.preview(bounded, NOW).dst.changes]
    assert dates == ["Sun 2026-10-25", "Sun 2027-03-28"]


def test_the_table_in_docs_dst_md_is_what_the_preview_lists():
    page = (Path(__file__).resolve().parent.parent / "docs" / "dst.md").read_text()
    skip_both = Schedule(
        cron="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip", dst_repeat="both"
    )
    changes = preview.preview(skip_both, NOW).dst.changes
    for change in changes:
        row = [change.date(), change.offsets(), change.walls(), change.rule(), change.result()]
        assert f"| {' | '.join(row)} |" in page, row
    assert len(changes) == 4
