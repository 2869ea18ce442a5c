"""Every schedule row renders in the admin, however odd the values raw SQL left in it.

The rows are written with ``update()`` past ``clean()``, as a script, raw SQL or an older
version would have stored them; a cell that cannot be shown says why instead of failing the
page.
"""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import Schedule
from django_periodic.timing import bounds
from tests.factories import RunFactory, ScheduleFactory

LIST_URL = reverse("admin:django_periodic_schedule_changelist")
RUNS_URL = reverse("admin:django_periodic_run_changelist")
# Python's limits, an hour inside them; a site or schedule zone east (+14:00) of UTC moves the
# first past datetime.max, one west (-12:00) the second before datetime.min.
END_OF_TIME = datetime(9999, 12, 31, 23, tzinfo=UTC)
START_OF_TIME = datetime(1, 1, 1, 1, tzinfo=UTC)
EAST, WEST = "Pacific/Kiritimati", "Etc/GMT+12"
ONCE = {"cron": "", "interval": None}
CRON = {"cron": "0 3 * * *", "interval": None}
RRULE = {**ONCE, "run_at": None, "start_at": datetime(2026, 1, 1, tzinfo=UTC)}
# A rule python-dateutil would search to the year 9999 for its first fire.
NEVER_FIRES = {**RRULE, "rrule": "FREQ=SECONDLY;BYSETPOS=2"}

# (what is odd, the values stored, the site's time zone)
ODD_ROWS = [
    ("one-shot at the end of time", {**ONCE, "run_at": END_OF_TIME, "timezone": EAST}, EAST),
    ("one-shot at the start of time", {**ONCE, "run_at": START_OF_TIME, "timezone": WEST}, WEST),
    ("window at the end of time", {**CRON, "start_at": END_OF_TIME, "end_at": END_OF_TIME}, EAST),
    ("window at the start of time", {"start_at": START_OF_TIME, "end_at": START_OF_TIME}, WEST),
    ("window ending before it starts", {"start_at": END_OF_TIME, "end_at": START_OF_TIME}, "UTC"),
    ("cursor at the end of time", {"next_fire_at": END_OF_TIME}, EAST),
    ("cursor at the start of time", {"next_fire_at": START_OF_TIME}, WEST),
    ("created at the end of time", {"created_at": END_OF_TIME, "updated_at": END_OF_TIME}, EAST),
    ("unknown time zone", {**CRON, "timezone": "Mars/Olympus"}, "UTC"),
    ("unknown time zone of a one-shot", {**ONCE, "run_at": END_OF_TIME, "timezone": ""}, "UTC"),
    ("interval of zero", {"interval": timedelta(0)}, "UTC"),
    ("negative interval", {"interval": timedelta(seconds=-30)}, "UTC"),
    # 10**8 days: the most SQLite's bigint of microseconds holds, in round numbers.
    ("huge interval", {"interval": timedelta(days=10**8)}, EAST),
    (
        "negative durations",
        {
            "misfire_grace": timedelta(minutes=-1),
            "retry_backoff": timedelta(seconds=-10),
            "timeout": timedelta(seconds=-1),
            "lease_timeout": timedelta(seconds=-30),
            "keep_runs_for": timedelta(days=-1),
            "keep_failed_runs_for": timedelta(days=-2),
        },
        "UTC",
    ),
    ("cron that does not parse", {**CRON, "cron": "every day at noon"}, "UTC"),
    ("cron out of range", {**CRON, "cron": "99 * * * *"}, "UTC"),
    ("no trigger", {**ONCE, "run_at": None}, "UTC"),
    ("every trigger at once", {"cron": "0 3 * * *", "run_at": END_OF_TIME}, EAST),
    ("args and kwargs of the wrong type", {"args": {"a": 1}, "kwargs": [1, 2]}, "UTC"),
    ("args and kwargs that are strings", {"args": "text", "kwargs": "text"}, "UTC"),
    ("unknown job", {"job": "gone.module.job"}, "UTC"),
    ("no cursor", {"next_fire_at": None}, "UTC"),
    ("not planned yet", {"next_fire_at": bounds.UNPLANNED}, "UTC"),
    ("counts out of range", {"max_attempts": 0, "max_queued": 0, "keep_runs": 0}, "UTC"),
    ("RRULE that never fires", NEVER_FIRES, EAST),
    # Its fires are whole seconds from 1900 on: found by arithmetic, not a walk of 127 years.
    (
        "RRULE counted from 1900",
        {**RRULE, "rrule": "FREQ=SECONDLY;COUNT=10000000000", "start_at": bounds.EARLIEST},
        "UTC",
    ),
]


@pytest.fixture
def unchecked(db):
    """Let this test store what the CHECK constraints refuse, as rows stored before those
    constraints existed were: on PostgreSQL they are dropped inside the test's transaction
    (so the drop is rolled back with it); SQLite is told to ignore them for a while."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            table = Schedule._meta.db_table
            cursor.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
                [table],
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
            yield
        else:
            cursor.execute("PRAGMA ignore_check_constraints = ON")
            yield
            cursor.execute("PRAGMA ignore_check_constraints = OFF")


def odd_schedule(values: dict) -> Schedule:
    """A schedule with a run, then ``values`` written over its row past ``clean()``."""
    schedule = ScheduleFactory(name="odd")
    RunFactory(schedule=schedule, plan_time=clock.now() - timedelta(minutes=1), status="failed")
    Schedule.objects.filter(pk=schedule.pk).update(**values)
    return schedule


def pages(schedule: Schedule) -> dict[str, str]:
    run = schedule.runs.get()
    return {
        "the list": LIST_URL,
        "its page": reverse("admin:django_periodic_schedule_change", args=[schedule.pk]),
        "its runs": f"{RUNS_URL}?schedule={schedule.pk}",
        "a run's page": reverse("admin:django_periodic_run_change", args=[run.pk]),
        "the delete confirmation": reverse(
            "admin:django_periodic_schedule_delete", args=[schedule.pk]
        ),
    }


@pytest.mark.parametrize(
    ("values", "site_zone"),
    [pytest.param(values, zone, id=odd) for odd, values, zone in ODD_ROWS],
)
def test_an_odd_row_renders(admin_client, client, unchecked, settings, values, site_zone):
    settings.TIME_ZONE = site_zone
    schedule = odd_schedule(values)
    for page, url in pages(schedule).items():
        response = admin_client.get(url)
        assert response.status_code == 200, page
        assert "odd" in response.content.decode(), page
    # Read-only, every field is shown by the admin's display instead of the form's inputs.
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename="view_schedule"))
    client.force_login(viewer)
    response = client.get(pages(schedule)["its page"])
    assert response.status_code == 200
    assert 'name="cron"' not in response.content.decode()


def cell(html: str, column: str) -> str:
    """The content of the first row's cell of ``column`` in a change list."""
    found = re.search(rf'<td class="field-{column}">(.*?)</td>', html, re.DOTALL)
    assert found, f"no {column} cell"
    return found.group(1)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({**CRON, "cron": "99 * * * *"}, "Invalid minute field &#x27;99&#x27;"),
        ({**CRON, "timezone": "Mars/Olympus"}, "Unknown time zone &#x27;Mars/Olympus&#x27;"),
        ({"interval": timedelta(0)}, "positive"),
        ({**ONCE, "run_at": None}, "A schedule needs a cron, an interval, a run_at or an rrule."),
        (NEVER_FIRES, "This rule never fires"),
    ],
)
def test_an_invalid_trigger_says_why_in_the_list(admin_client, unchecked, values, reason):
    odd_schedule(values)
    trigger = cell(admin_client.get(LIST_URL).content.decode(), "trigger_in_words")
    assert '<span class="periodic-invalid">invalid: ' in trigger
    assert reason in trigger


def test_a_bad_cron_is_still_shown_as_typed(admin_client, unchecked):
    odd_schedule({**CRON, "cron": "99 * * * *"})
    trigger = cell(admin_client.get(LIST_URL).content.decode(), "trigger_in_words")
    assert '<code class="periodic-quiet">99 * * * *</code>' in trigger


def test_a_schedule_stored_without_save_is_not_planned_yet(admin_client, unchecked):
    odd_schedule({"next_fire_at": bounds.UNPLANNED})
    next_fire = cell(admin_client.get(LIST_URL).content.decode(), "next_fire")
    assert next_fire == '<span class="periodic-quiet">not planned yet</span>'


def test_a_time_the_sites_clock_cannot_hold_is_shown_in_utc(admin_client, unchecked, settings):
    settings.TIME_ZONE = EAST
    schedule = odd_schedule({**ONCE, "run_at": END_OF_TIME, "next_fire_at": END_OF_TIME})
    next_fire = cell(admin_client.get(LIST_URL).content.decode(), "next_fire")
    assert 'title="9999-12-31 23:00:00 UTC"' in next_fire
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    form = page.content.decode()
    assert 'name="run_at_0" value="9999-12-31"' in form
    assert 'name="run_at_1" value="23:00:00"' in form


def test_a_preview_that_cannot_be_computed_says_why_on_the_page(admin_client, unchecked):
    schedule = odd_schedule({"interval": timedelta(seconds=-30)})
    page = admin_client.get(reverse("admin:django_periodic_schedule_change", args=[schedule.pk]))
    preview = re.search(r'id="periodic-preview".*?</div>', page.content.decode(), re.DOTALL)
    assert preview and "positive" in preview.group(0)
