"""A schedule's ping URL: validated (http or https only, no credentials, a port in range, no
link-local or unspecified address, a host of PING_HOSTS if set; a clear error that does not
repeat it) by clean(), the admin's form and, for the scheme, a CHECK; set by
``@job(ping_url=...)``; and kept secret: not on a view-only user's page nor in its source,
not in versions (a fingerprint that tells it changed), kept as it is when a version is
restored, not in periodic_status's output, not in what is logged."""

import contextlib
import io
import json
import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.urls import reverse

from django_periodic import registry
from django_periodic.engine.planning.code_schedules import sync_code_schedules
from django_periodic.models import Schedule, ScheduleVersion, restore_version
from django_periodic.models.versions import update_versioned
from tests.factories import ScheduleFactory, schedule_form_data

pytestmark = pytest.mark.django_db
KEY = "0b6f8f1e-5d5e-4a37-b0b4-3c1e6d1f2a9c"
URL = f"https://hc-ping.com/{KEY}"
OTHER_KEY = "9d2c5a10-8e4b-4f6a-a1c3-7b0e2f4d6c88"


def schedule_url(schedule, view="change"):
    return reverse(f"admin:django_periodic_schedule_{view}", args=[schedule.pk])


def staff(client, name, *codenames):
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [URL, "http://127.0.0.1:8000/ping/x?create=1", ""])
def test_an_http_or_https_url_or_none_is_valid(url):
    ScheduleFactory.build(ping_url=url).full_clean()


@pytest.mark.parametrize(
    "url", [f"ftp://hc-ping.com/{KEY}", f"file:///etc/{KEY}", f"hc-ping.com/{KEY}", f"{KEY}"]
)
def test_anything_else_is_refused_on_its_field_without_repeating_it(url):
    with pytest.raises(ValidationError) as refused:
        ScheduleFactory.build(ping_url=url).full_clean()
    (message,) = refused.value.message_dict["ping_url"]
    assert "http:// or https:// URL" in message
    assert KEY not in message


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        (f"https://user:{KEY}@hc-ping.com/x", "must not hold a user name or password"),
        (f"https://hc-ping.com@127.0.0.1/{KEY}", "must not hold a user name or password"),
        (f"http://127.0.0.1:70000/{KEY}", "port must be from 1 to 65535"),
        (f"https://hc-ping.com:0/{KEY}", "port must be from 1 to 65535"),
        (f"http://169.254.169.254/latest/{KEY}", "link-local or unspecified address"),
        (f"http://[fe80::1]/{KEY}", "link-local or unspecified address"),
        (f"http://[::ffff:169.254.169.254]/{KEY}", "link-local or unspecified address"),
        (f"http://0.0.0.0:8000/{KEY}", "link-local or unspecified address"),
        (f"http://[::]:8000/{KEY}", "link-local or unspecified address"),
    ],
)
def test_credentials_a_port_out_of_range_or_a_local_address_are_refused_on_its_field(url, refused):
    with pytest.raises(ValidationError) as error:
        ScheduleFactory.build(ping_url=url).full_clean()
    (message,) = error.value.message_dict["ping_url"]
    assert refused in message
    assert KEY not in message


def test_the_admin_form_refuses_credentials_on_the_field(client):
    schedule = ScheduleFactory(name="from-admin", job="tests.jobs.add", args=[1, 2])
    editor = staff(client, "editor", "view_schedule", "change_schedule")
    posted = schedule_form_data(ping_url=f"https://me:{KEY}@hc-ping.com/check")
    refused = editor.post(schedule_url(schedule), posted)
    (message,) = refused.context["adminform"].form.errors["ping_url"]
    assert "user name or password" in message and KEY not in message
    assert Schedule.objects.get(pk=schedule.pk).ping_url == ""


def test_ping_hosts_allows_its_hosts_and_the_subdomains_of_a_dotted_one_only(settings):
    settings.DJANGO_PERIODIC = {"PING_HOSTS": ["hc-ping.com", ".example.com"]}
    for allowed in (
        URL,
        f"https://HC-PING.com/{KEY}",
        "https://example.com/x",
        "https://a.example.com/x",
    ):
        ScheduleFactory.build(ping_url=allowed).full_clean()
    for refused in (
        f"https://hc-ping.com.evil.example/{KEY}",
        f"https://ping.hc-ping.com/{KEY}",
        f"https://notexample.com/{KEY}",
        f"http://127.0.0.1:8000/{KEY}",
    ):
        with pytest.raises(ValidationError) as error:
            ScheduleFactory.build(ping_url=refused).full_clean()
        (message,) = error.value.message_dict["ping_url"]
        assert message == (
            "ping_url's host is not one the PING_HOSTS setting allows (hc-ping.com, .example.com)."
        )


@pytest.mark.parametrize("hosts", [None, []])
def test_without_ping_hosts_any_host_is_allowed(settings, hosts):
    settings.DJANGO_PERIODIC = {"PING_HOSTS": hosts}
    for url in (URL, "http://10.0.0.5:8000/ping/x", "http://[::1]:8000/x", "http://localhost/x"):
        ScheduleFactory.build(ping_url=url).full_clean()


def test_a_url_too_long_is_refused_with_its_length():
    with pytest.raises(ValidationError) as refused:
        ScheduleFactory.build(ping_url=URL + "/" + "x" * 500).full_clean()
    assert "at most 500 characters" in str(refused.value.message_dict["ping_url"])


def test_the_database_refuses_a_scheme_clean_would_refuse():
    schedule = ScheduleFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(ping_url=f"file:///etc/{KEY}")
    Schedule.objects.filter(pk=schedule.pk).update(ping_url=URL.replace("https", "HTTPS"))


def test_job_ping_url_is_synced_to_its_schedule(clean_registry):
    registry.job(name="tests.pinged", cron="0 3 * * *", ping_url=URL)(lambda: None)
    sync_code_schedules()
    assert Schedule.objects.get(name="tests.pinged").ping_url == URL
    del registry._registry["tests.pinged"]
    registry.job(name="tests.pinged", cron="0 3 * * *")(lambda: None)  # removed in code
    sync_code_schedules()
    assert Schedule.objects.get(name="tests.pinged").ping_url == ""


def test_a_bad_ping_url_in_code_is_logged_without_it(clean_registry, caplog):
    registry.job(name="tests.badly_pinged", cron="0 3 * * *", ping_url=f"ftp://x/{KEY}")(
        lambda: None
    )
    with caplog.at_level(logging.ERROR, logger="django_periodic"):
        report = sync_code_schedules()
    assert report.invalid == ["tests.badly_pinged"]
    assert "http:// or https:// URL" in caplog.text
    assert KEY not in caplog.text


# -- the admin ---------------------------------------------------------------------------------


def test_a_view_only_user_never_gets_the_url_on_any_page(client):
    schedule = ScheduleFactory(ping_url=URL)
    schedule.ping_url = f"https://hc-ping.com/{OTHER_KEY}"
    schedule.save()
    viewer = staff(client, "viewer", "view_schedule", "view_run")
    for url in (
        schedule_url(schedule),
        schedule_url(schedule, "history"),
        reverse("admin:django_periodic_schedule_changelist"),
    ):
        page = viewer.get(url)
        assert page.status_code == 200
        text = page.content.decode()
        assert KEY not in text and OTHER_KEY not in text, url
    assert "id_ping_url" not in viewer.get(schedule_url(schedule)).content.decode()


def test_a_user_who_may_change_sees_and_edits_it(client):
    fields = {"job": "tests.jobs.add", "args": [1, 2], "interval": None, "timezone": "UTC"}
    schedule = ScheduleFactory(name="from-admin", cron="* * * * *", ping_url=URL, **fields)
    editor = staff(client, "editor", "view_schedule", "change_schedule")
    page = editor.get(schedule_url(schedule)).content.decode()
    assert f'value="{URL}"' in page
    refused = editor.post(schedule_url(schedule), schedule_form_data(ping_url="ftp://nowhere"))
    assert refused.context["adminform"].form.errors["ping_url"] == [
        "ping_url must be an http:// or https:// URL, e.g. https://hc-ping.com/<uuid>."
    ]
    changed = schedule_form_data(ping_url=f"https://hc-ping.com/{OTHER_KEY}")
    assert editor.post(schedule_url(schedule), changed).status_code == 302
    assert Schedule.objects.get(pk=schedule.pk).ping_url.endswith(OTHER_KEY)


# -- versions, status, logs -------------------------------------------------------------------


def test_versions_record_that_it_changed_never_what_it_is(admin_client):
    schedule = ScheduleFactory(ping_url=URL)
    schedule.ping_url = f"https://hc-ping.com/{OTHER_KEY}"
    schedule.save()
    update_versioned(Schedule.objects.filter(pk=schedule.pk), ping_url="")
    created, changed, removed = schedule.versions.order_by("id")
    for version in (created, changed, removed):
        stored = json.dumps([version.changes, version.fields])
        assert KEY not in stored and OTHER_KEY not in stored
    old, new = changed.changes["ping_url"]
    assert old.startswith("(set ") and new.startswith("(set ") and old != new
    assert removed.changes["ping_url"][1] == "" and removed.fields["ping_url"] == ""
    history = admin_client.get(schedule_url(schedule, "history")).content.decode()
    assert "(changed)" in history and KEY not in history and old not in history


def test_a_change_of_something_else_records_no_change_of_it():
    schedule = ScheduleFactory(ping_url=URL)
    schedule.max_attempts = 3
    schedule.save()
    assert set(schedule.versions.order_by("-id")[0].changes) == {"max_attempts"}


def test_restoring_a_version_keeps_the_url_as_it_is_now():
    schedule = ScheduleFactory(ping_url="", max_attempts=1)
    first = schedule.versions.get()
    schedule.ping_url, schedule.max_attempts = URL, 2
    schedule.save()
    restore_version(first)
    restored = Schedule.objects.get(pk=schedule.pk)
    assert (restored.max_attempts, restored.ping_url) == (1, URL)
    latest = ScheduleVersion.objects.filter(schedule=schedule).order_by("-id")[0]
    assert "ping_url" not in latest.changes


def test_periodic_status_and_explain_do_not_show_it():
    schedule = ScheduleFactory(ping_url=URL)
    for options in ({}, {"json": True}, {"explain": schedule.name}):
        out = io.StringIO()
        # No scheduler alive: the verdict is a failure (exit status 1), the report printed.
        with contextlib.suppress(SystemExit):
            call_command("periodic_status", stdout=out, stderr=io.StringIO(), **options)
        assert out.getvalue() and KEY not in out.getvalue()
