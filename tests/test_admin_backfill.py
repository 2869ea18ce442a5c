"""The "Backfill missed runs…" action: its form, preview and report, through the test client."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from django_periodic.db import clock
from django_periodic.engine.planning import backfill
from django_periodic.models import Run
from tests.factories import RunFactory, ScheduleFactory

LIST_URL = reverse("admin:django_periodic_schedule_changelist")
FORMAT = "%Y-%m-%dT%H:%M:%S"


def local(moment):
    return timezone.localtime(moment).strftime(FORMAT)


def post(client, schedules, button=None, **fields):
    """Post the action from the list (no button), or the backfill page's form."""
    data = {"action": "backfill", "_selected_action": [s.pk for s in schedules]}
    if button is None:
        data["index"] = "0"
    else:
        data[button] = "yes"
        data.update({name: value for name, value in fields.items() if value is not None})
    return client.post(LIST_URL, data, follow=True)


@pytest.fixture
def hour_ago(db):
    """A whole hour ago: the start of a range with six fires of a 10-minute cron."""
    return clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


def ten_minutes(**fields):
    return ScheduleFactory(**{"cron": "*/10 * * * *", "interval": None, **fields})


def backfilled():
    return Run.objects.filter(trigger=Run.Trigger.BACKFILL)


def test_the_action_shows_the_range_form_for_the_selected_schedules(admin_client, db):
    schedule = ten_minutes(name="reports")
    page = post(admin_client, [schedule]).content.decode()
    assert 'id="backfill-form"' in page
    assert "reports" in page
    assert 'type="datetime-local"' in page
    assert "backfill-preview" not in page  # no count before a valid range


def test_preview_counts_the_runs_to_record_and_the_plan_times_that_have_one(admin_client, hour_ago):
    schedule = ten_minutes()
    RunFactory(schedule=schedule, plan_time=hour_ago, status="succeeded")
    end = hour_ago + timedelta(minutes=30)
    response = post(admin_client, [schedule], "_backfill_preview", start=local(hour_ago),
                    end=local(end), rate="1")  # fmt: skip
    preview = response.context["previews"]
    assert [(s.pk, r.recorded, r.existing) for s, r in preview] == [(schedule.pk, 2, 1)]
    assert "Backfill 2 runs" in response.content.decode()
    assert not backfilled().exists()


def test_an_end_in_the_future_is_clamped_to_now_as_the_api_clamps_it(admin_client, hour_ago):
    schedule = ten_minutes()
    response = post(admin_client, [schedule], "_backfill_preview", start=local(hour_ago),
                    end=local(hour_ago + timedelta(days=1)), rate="1")  # fmt: skip
    ((_, result),) = response.context["previews"]
    api = backfill.preview(schedule, hour_ago, hour_ago + timedelta(days=1), clock.now())
    assert result.end <= api.end <= clock.now()
    assert result.recorded == api.recorded >= 6  # the past hour's fires, none after now
    assert 'class="backfill-end"' in response.content.decode()


def test_backfill_records_the_runs_and_reports_them(admin_client, hour_ago):
    schedules = [ten_minutes(), ten_minutes()]
    RunFactory(schedule=schedules[0], plan_time=hour_ago, status="succeeded")
    end = hour_ago + timedelta(minutes=30)
    response = post(admin_client, schedules, "_backfill_apply", start=local(hour_ago),
                    end=local(end), rate="2")  # fmt: skip
    assert response.redirect_chain == [(LIST_URL, 302)]
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [
        "Recorded 5 runs to backfill (1 plan times already had a run); "
        "released at most 2 per second per schedule."
    ]
    assert backfilled().count() == 5
    schedule = schedules[1]
    releases = list(backfilled().filter(schedule=schedule).values_list("next_retry_at", flat=True))
    assert max(releases) - min(releases) == timedelta(seconds=1)  # 3 runs, 0.5 s apart


@pytest.mark.parametrize(
    ("start", "end", "error"),
    [
        (timedelta(minutes=30), timedelta(minutes=10), "must come before end"),
        (timedelta(days=1), timedelta(days=2), "is in the future"),
        (None, timedelta(minutes=10), "This field is required."),
    ],
)
def test_a_bad_range_is_refused_with_a_clear_error_and_records_nothing(
    admin_client, hour_ago, start, end, error
):
    schedule = ten_minutes()
    response = post(
        admin_client,
        [schedule],
        "_backfill_apply",
        start=None if start is None else local(hour_ago + start),
        end=local(hour_ago + end),
        rate="1",
    )
    assert error in response.content.decode()
    assert not backfilled().exists()


def test_a_range_beyond_the_limit_is_refused_naming_it(admin_client, hour_ago):
    schedule = ten_minutes(cron="* * * * *", name="every minute")
    start = hour_ago - timedelta(minutes=backfill.MAX_RUNS)
    response = post(admin_client, [schedule], "_backfill_apply", start=local(start),
                    end=local(hour_ago + timedelta(minutes=1)), rate="1")  # fmt: skip
    page = response.content.decode()
    assert f"the limit per call is {backfill.MAX_RUNS}" in page
    assert "every minute" in page
    assert not backfilled().exists()


def test_a_rate_that_is_not_positive_is_refused(admin_client, hour_ago):
    schedule = ten_minutes()
    response = post(admin_client, [schedule], "_backfill_apply", start=local(hour_ago),
                    end=local(hour_ago + timedelta(minutes=20)), rate="0")  # fmt: skip
    assert "Ensure this value is greater than or equal to 0.001." in response.content.decode()
    assert not backfilled().exists()


def test_a_viewer_cannot_backfill(client, hour_ago):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client.force_login(viewer)
    schedule = ten_minutes()
    post(client, [schedule], "_backfill_apply", start=local(hour_ago),
         end=local(hour_ago + timedelta(minutes=20)), rate="1")  # fmt: skip
    assert not backfilled().exists()
    assert "backfill" not in client.get(LIST_URL).content.decode()


def test_the_run_list_shows_a_backfilled_run_awaiting_release_as_such(admin_client, hour_ago):
    schedule = ten_minutes()
    schedule.backfill(hour_ago, hour_ago + timedelta(minutes=10))
    response = admin_client.get(reverse("admin:django_periodic_run_changelist"))
    assert "awaiting release" in response.content.decode()
    Run.objects.update(attempt=1)  # once started, a backfilled run retries as any run
    response = admin_client.get(reverse("admin:django_periodic_run_changelist"))
    assert "awaiting release" not in response.content.decode()
