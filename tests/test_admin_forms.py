from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils.duration import duration_string

from django_periodic.admin.forms import ScheduleForm, timezone_names
from django_periodic.models import Schedule
from tests.factories import ScheduleFactory, schedule_form_data
from tests.helpers import nested_lists
from tests.test_bounds import OUTSIDE

pytestmark = pytest.mark.django_db


def data(**overrides):
    values = {"name": "report", "cron": "0 3 * * *", "timezone": "Europe/Berlin"}
    return schedule_form_data(**{**values, **overrides})


def errors(**overrides):
    form = ScheduleForm(data(**overrides))
    assert not form.is_valid()
    return form.errors


def test_a_valid_cron_schedule_saves():
    form = ScheduleForm(data())
    assert form.is_valid(), form.errors
    schedule = form.save()
    assert (schedule.cron, schedule.timezone, schedule.args) == (
        "0 3 * * *",
        "Europe/Berlin",
        [1, 2],
    )


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 25 * * *", "Invalid hour field '25': 25 is out of range 0-23."),
        ("61 * * * *", "Invalid minute field '61': 61 is out of range 0-59."),
        ("* * * * funday", "Invalid day-of-week field 'funday': unknown name 'funday'."),
        ("* * *", "Cron expression must have 5 fields"),
        ("@fortnightly", "Unknown macro '@fortnightly'"),
    ],
)
def test_a_bad_cron_names_the_wrong_field_on_the_cron_field(cron, message):
    assert message in errors(cron=cron)["cron"][0]


def test_an_unknown_time_zone_is_named():
    assert errors(timezone="Mars/Olympus")["timezone"] == ["Unknown time zone 'Mars/Olympus'."]


def test_a_job_that_is_not_registered_is_named_once():
    messages = errors(job="tests.jobs.nope")["job"]
    assert messages == ["No job named 'tests.jobs.nope' is registered (with @job)."]


def test_broken_json_says_where():
    message = errors(args="[1, 2")["args"][0]
    assert message.startswith("Not valid JSON:")
    assert "line 1, column 6" in message


def test_arguments_that_do_not_fit_the_job_are_refused():
    assert "do not fit tests.jobs.add()" in errors(args="[1]")["args"][0]


def test_args_must_be_a_list_and_kwargs_an_object():
    assert "JSON list" in errors(args='{"a": 1}')["args"][0]
    assert "JSON object" in errors(kwargs="[1]")["kwargs"][0]


def test_empty_argument_boxes_mean_no_arguments():
    form = ScheduleForm(data(job="tests.jobs.noop", args="", kwargs=""))
    assert form.is_valid(), form.errors
    assert (form.cleaned_data["args"], form.cleaned_data["kwargs"]) == ([], {})


def test_the_chosen_kind_clears_values_left_in_the_other_kinds_fields():
    form = ScheduleForm(data(trigger_kind="interval", interval="00:05:00"))
    assert form.is_valid(), form.errors
    schedule = form.save()
    assert (schedule.cron, schedule.interval) == ("", timedelta(minutes=5))


@pytest.mark.parametrize(
    ("kind", "field", "message"),
    [
        ("cron", "cron", "A cron trigger needs a cron expression."),
        ("interval", "interval", "An interval trigger needs an interval."),
        ("once", "run_at", "A one-shot trigger needs a time to run at."),
    ],
)
def test_the_chosen_kind_needs_its_field(kind, field, message):
    assert errors(trigger_kind=kind, cron="") == {field: [message]}


def test_a_one_shot_is_saved_from_its_time():
    form = ScheduleForm(data(trigger_kind="once", run_at="2030-01-02 03:04:05", cron=""))
    assert form.is_valid(), form.errors
    assert form.save().run_at.isoformat() == "2030-01-02T03:04:05+00:00"


def test_without_a_kind_the_model_insists_on_exactly_one_trigger():
    message = errors(trigger_kind="", interval="00:05:00")["cron"][0]
    assert "Set exactly one trigger" in message


def test_a_new_form_starts_from_the_model_defaults():
    form = ScheduleForm()
    assert form["args"].value() == "[]"
    assert form["kwargs"].value() == "{}"
    assert form["timezone"].value() == "UTC"  # settings.TIME_ZONE
    assert form["trigger_kind"].value() == "cron"


def test_an_existing_schedule_starts_from_its_own_kind():
    schedule = ScheduleFactory(interval=timedelta(minutes=5))
    assert ScheduleForm(instance=schedule)["trigger_kind"].value() == "interval"


def test_jobs_are_offered_with_their_docstrings_first_line():
    choices = dict(ScheduleForm().fields["job"].choices)
    assert choices["tests.jobs.add"] == "tests.jobs.add — Adds two numbers."


def test_a_stored_job_that_is_gone_is_still_shown_and_refused():
    schedule = ScheduleFactory()
    Schedule.objects.filter(pk=schedule.pk).update(job="tests.jobs.gone")
    schedule.refresh_from_db()
    form = ScheduleForm(instance=schedule)
    assert ("tests.jobs.gone", "tests.jobs.gone (not registered)") in form.fields["job"].choices


def test_time_zones_are_the_iana_names():
    names = timezone_names()
    assert {"Europe/Berlin", "America/New_York", "UTC"} <= set(names)
    assert "localtime" not in names
    assert list(names) == sorted(names)


# -- ranges (bounds.SCHEDULE): each shown on its own field ------------------------------------


def form_value(value) -> str:
    """A value as typed into the form (the site's time zone is UTC)."""
    if isinstance(value, timedelta):
        return duration_string(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def form_data_with(name: str, value) -> dict:
    fields = {name: form_value(value)}
    if name == "interval":
        fields.update(trigger_kind="interval", cron="")
    elif name == "run_at":
        fields.update(trigger_kind="once", cron="")
    return data(**fields)


# The schedule's form edits every bounded field but the pause's (the "Pause…" form's).
IN_THE_FORM = [case for case in OUTSIDE if case.values[0] in ScheduleForm.base_fields]


def test_every_bounded_field_but_the_pause_is_in_the_schedule_form():
    assert {case.values[0] for case in OUTSIDE} - {c.values[0] for c in IN_THE_FORM} == {
        "paused_until"
    }


@pytest.mark.parametrize(("name", "value"), IN_THE_FORM)
def test_a_value_out_of_range_is_refused_on_its_field(name, value):
    form = ScheduleForm(form_data_with(name, value))
    assert not form.is_valid()
    assert list(form.errors) == [name]
    assert len(form.errors[name]) == 1


def test_the_range_is_said_on_the_field():
    grace = errors(misfire_grace=form_value(timedelta(days=999_999)))
    assert grace == {"misfire_grace": ["misfire_grace must be at most 36525 days."]}
    interval = errors(trigger_kind="interval", cron="", interval="00:00:00.5")
    assert interval == {"interval": ["The interval (500 ms) must be at least MIN_INTERVAL (1 s)."]}
    late = errors(trigger_kind="once", cron="", run_at="9999-12-31 23:00:00")
    assert late == {"run_at": ["run_at must be before 9000-01-01 00:00 UTC."]}


def test_the_admin_page_shows_the_range_and_saves_nothing(admin_client):
    url = reverse("admin:django_periodic_schedule_add")
    response = admin_client.post(url, schedule_form_data(lease_timeout="100000000 00:00:00"))
    assert response.status_code == 200
    assert "lease_timeout must be at most 7 days." in response.content.decode()
    assert not Schedule.objects.exists()


# -- arguments no schedule can hold: an error on the field, never a 500 ----------------------

ADD_URL = reverse("admin:django_periodic_schedule_add")
NOT_JSON = "JSON has no NaN or infinity."
TOO_DEEP = "cannot nest lists and objects more than 32 levels deep."


@pytest.fixture
def editor(client):
    """A client logged in as staff who may add schedules, and no more."""
    user = User.objects.create_user("editor", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="add_schedule"))
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("args", "[1, NaN]", f"args cannot hold NaN: {NOT_JSON}"),
        ("args", "[1, 1e400]", f"args cannot hold Infinity: {NOT_JSON}"),
        ("kwargs", '{"limit": -Infinity}', f"kwargs cannot hold -Infinity: {NOT_JSON}"),
        ("kwargs", '{"a": {"b": [NaN]}}', f"kwargs cannot hold NaN: {NOT_JSON}"),
        ("args", str(nested_lists(500)), f"args {TOO_DEEP}"),
        ("args", "[" * 100_000 + "]" * 100_000, f"args {TOO_DEEP}"),
        ("args", f"[{'1' * 5000}]", "A number has more than 4300 digits, more than Python reads."),
    ],
    ids=["nan", "infinity", "-infinity", "nested nan", "500 deep", "100000 deep", "5000 digits"],
)
def test_arguments_no_schedule_can_hold_are_refused_on_their_field(editor, field, text, message):
    posted = schedule_form_data(job="tests.jobs.noop", **{field: text})

    response = editor.post(ADD_URL, posted)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {field: [message]}
    assert not Schedule.objects.exists()


def test_arguments_nested_32_deep_are_saved_with_their_version(editor):
    posted = schedule_form_data(job="tests.jobs.noop", args=str(nested_lists(32)))

    response = editor.post(ADD_URL, posted)

    assert response.status_code == 302
    schedule = Schedule.objects.get()
    assert schedule.args == nested_lists(32)
    assert schedule.versions.get().fields["args"] == nested_lists(32)
