from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_periodic.admin import preview
from django_periodic.models import Schedule
from tests.factories import ScheduleFactory

PREVIEW_URL = reverse("admin:django_periodic_schedule_preview")
# Europe/Berlin springs forward on 2030-03-31 at 02:00 (to 03:00) and falls back on 2030-10-27.
BEFORE_SPRING = datetime(2030, 3, 28, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("*/5 * * * *", "Every 5 minutes"),
        ("0 3 * * *", "At 03:00"),
        ("@daily", "At 00:00"),
        ("@hourly", "Every hour"),
        ("0 8 * * mon", "At 08:00, only on Monday"),
        ("0 0 1 * mon", "At 00:00, on day 1 of the month, or on Monday"),
        ("0 0 */2 * mon", "At 00:00, every 2 days, and only on Monday"),
    ],
)
def test_cron_in_words_reads_days_as_vixie_cron(expression, words):
    assert preview.describe_cron(expression) == words


def test_intervals_in_words():
    assert preview.describe_interval(timedelta(seconds=30)) == "30 seconds"
    assert preview.describe_interval(timedelta(hours=1, minutes=30)) == "1 hour 30 minutes"
    assert preview.describe_interval(timedelta(days=2)) == "2 days"


def test_a_schedule_in_words_includes_its_bounds():
    schedule = Schedule(
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        start_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert preview.describe(schedule) == "At 02:30, from 2030-01-01 01:00 CET"


def test_the_preview_lists_ten_fires_in_the_zone_and_in_utc():
    schedule = Schedule(cron="0 12 * * *", timezone="America/New_York")
    result = preview.preview(schedule, datetime(2030, 1, 1, tzinfo=UTC))
    assert len(result.fires) == 10
    local, utc, change, closed = result.rows()[0]
    assert local == "Tue 2030-01-01 12:00 EST (UTC-05:00)"
    assert utc == "2030-01-01 17:00"
    assert change == closed == ""


def test_the_fire_after_a_dst_change_is_flagged():
    schedule = Schedule(cron="30 2 * * *", timezone="Europe/Berlin")
    rows = preview.preview(schedule, BEFORE_SPRING).rows()
    flagged = [(local, change) for local, _, change, _ in rows if change]
    # 02:30 does not exist on 2030-03-31: Debian cron fires right after the change.
    assert flagged == [
        (
            "Sun 2030-03-31 03:00 CEST (UTC+02:00)",
            "daylight saving time starts: UTC+01:00 → UTC+02:00",
        )
    ]


def test_an_invalid_trigger_previews_its_error_instead_of_times():
    schedule = Schedule(cron="0 25 * * *", timezone="UTC")
    result = preview.preview(schedule, BEFORE_SPRING)
    assert result.fires == []
    assert "Invalid hour field" in result.errors["__all__"][0]


def test_a_paused_schedule_says_its_times_wait_for_a_resume():
    schedule = Schedule(interval=timedelta(hours=1), enabled=False, created_at=BEFORE_SPRING)
    notes = preview.preview(schedule, BEFORE_SPRING).notes
    assert any("paused" in note for note in notes)


def of(schedule) -> str:
    """The preview of a saved schedule: its id in the URL, what is typed in the body."""
    return f"{PREVIEW_URL}?object_id={schedule.pk}"


def typed(**fields):
    values = {"trigger_kind": "cron", "cron": "0 3 * * *", "timezone": "Europe/Berlin"}
    return {**values, **fields}


def test_the_json_view_previews_what_is_typed(admin_client):
    response = admin_client.post(PREVIEW_URL, typed(cron="*/15 9-17 * * mon-fri"))
    assert response.status_code == 200
    payload = response.json()
    assert (
        payload["description"] == "Every 15 minutes, between 09:00 and 17:59, Monday through Friday"
    )
    assert len(payload["fires"]) == 10
    assert payload["fires"][0]["local"].endswith(("+01:00", "+02:00"))
    assert "Every 15 minutes" in payload["html"]


def test_the_json_view_names_the_wrong_cron_field(admin_client):
    payload = admin_client.post(PREVIEW_URL, typed(cron="0 25 * * *")).json()
    assert payload["fires"] == []
    assert payload["errors"]["cron"] == ["Invalid hour field '25': 25 is out of range 0-23."]
    assert "Invalid hour field" in payload["html"]


def test_the_json_view_names_an_unknown_time_zone(admin_client):
    payload = admin_client.post(PREVIEW_URL, typed(timezone="Mars/Olympus")).json()
    assert payload["errors"] == {"timezone": ["Unknown time zone 'Mars/Olympus'."]}


def test_the_json_view_previews_the_kind_chosen(admin_client):
    payload = admin_client.post(PREVIEW_URL, typed(trigger_kind="interval", interval="00:00:30"))
    assert payload.json()["description"] == "Every 30 seconds"


def test_the_json_view_of_a_saved_schedule_applies_the_typed_changes(admin_client):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *")
    payload = admin_client.post(of(schedule), typed(cron="0 4 * * *")).json()
    assert payload["description"] == "At 04:00"
    schedule.refresh_from_db()
    assert schedule.cron == "0 3 * * *"  # a preview never saves


def test_the_json_view_of_a_missing_schedule_is_404(admin_client):
    assert admin_client.post(f"{PREVIEW_URL}?object_id=999999").status_code == 404


def test_the_change_page_shows_the_preview_after_save(admin_client):
    schedule = ScheduleFactory(interval=None, cron="0 3 * * *", timezone="Europe/Berlin")
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    html = page.content.decode()
    assert 'id="periodic-preview"' in html
    assert f'data-url="{PREVIEW_URL}?object_id={schedule.pk}"' in html
    assert "At 03:00" in html
    assert html.count("03:00 CE") == 10  # CET or CEST: ten fires on Berlin's wall clock


def test_the_json_view_needs_a_schedule_permission(client, db):
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.post(PREVIEW_URL, typed()).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="add_schedule"))
    assert client.post(PREVIEW_URL, typed()).status_code == 200


def test_the_json_view_of_a_schedule_needs_its_view_permission(client, db):
    schedule = ScheduleFactory()
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="add_schedule"))
    client.force_login(staff)
    assert client.post(of(schedule)).status_code == 403


def test_the_json_view_is_not_for_anonymous_users(client, db):
    response = client.post(PREVIEW_URL, typed())
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_the_json_view_answers_only_post_so_no_argument_is_ever_in_a_url(admin_client):
    secret = typed(args='["s3cr3t-token"]')
    assert admin_client.get(PREVIEW_URL, secret).status_code == 405
    assert admin_client.post(PREVIEW_URL, secret).status_code == 200


def test_the_json_view_refuses_a_post_without_the_csrf_token(db):
    User.objects.create_superuser("root", "root@example.com", "pw")
    checked = Client(enforce_csrf_checks=True)
    checked.login(username="root", password="pw")
    assert checked.post(PREVIEW_URL, typed()).status_code == 403
