"""No change list of the admin filters or searches by a secret (admin/secrets.py), whoever
asks: a filter such as ``?ping_url__startswith=https://hc-ping.com/0``, answered with the row
or without it, would spell the ping URL out one character at a time to a user who may only
view. Every lookup Django registers for the field, on every path to it from every change
list of the app, is refused with a 400 (as Django refuses a lookup it does not allow),
whether or not it would match."""

import pytest
from django.contrib import admin
from django.contrib.admin.sites import AdminSite
from django.contrib.auth.models import Permission, User
from django.db.models import Model
from django.test import RequestFactory
from django.urls import reverse

from django_periodic.admin import ScheduleAdmin
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from django_periodic.models.schedule_fields import SECRET_FIELDS
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory

pytestmark = pytest.mark.django_db
KEY = "0b6f8f1e-5d5e-4a37-b0b4-3c1e6d1f2a9c"
URL = f"https://hc-ping.com/{KEY}"
PERIODIC_ADMINS = [
    model_admin
    for model, model_admin in admin.site._registry.items()
    if model._meta.app_label == "django_periodic"
]
# A value each lookup matches the secret with (the URL for the others, such as "in"): the
# answer must not differ from that to a value it does not match.
MATCHING = {
    "contains": KEY[:8],
    "icontains": KEY[:8].upper(),
    "startswith": "https://hc-ping.com/0",
    "istartswith": "HTTPS://HC-PING.COM/0",
    "endswith": KEY[-8:],
    "iendswith": KEY[-8:].upper(),
    "regex": r"^https://hc-ping\.com/0",
    "iregex": r"^HTTPS://hc-ping\.com/0",
    "gt": "https://hc-ping.com/",
    "gte": "https://hc-ping.com/",
    "lt": "https://hc-ping.com/z",
    "lte": "https://hc-ping.com/z",
    "range": "az",  # the admin passes the string on: its two characters are the ends
    "isnull": "False",
}
NOT_MATCHING = {"isnull": "True", "range": "ab"}


def secret_paths(model: type[Model], seen: frozenset = frozenset()) -> list[tuple[str, str]]:
    """(lookup path, field name) of each secret reachable from ``model`` through its
    relations, forward and reverse, visiting no model twice: ``ping_url`` from Schedule,
    ``schedule__ping_url`` from Run, ``run__schedule__ping_url`` from Lease, ..."""
    if model in seen:
        return []
    found = [(name, name) for name in SECRET_FIELDS if issubclass(model, Schedule)]
    for field in model._meta.get_fields():
        if field.is_relation and field.related_model is not None:
            for path, name in secret_paths(field.related_model, seen | {model}):
                found.append((f"{field.name}__{path}", name))
    return found


def changelist(model_admin: admin.ModelAdmin) -> str:
    opts = model_admin.model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")


def filters_on_secrets() -> list[tuple[str, str, str]]:
    """(change list URL, filter, value) for every lookup of every path to a secret, each
    with a value that matches it and one that does not."""
    asked = []
    for model_admin in PERIODIC_ADMINS:
        for path, name in secret_paths(model_admin.model):
            field = Schedule._meta.get_field(name)
            asked.append((changelist(model_admin), path, URL))  # exact, by the bare path
            for lookup in sorted(field.get_lookups()):
                for value in (MATCHING.get(lookup, URL), NOT_MATCHING.get(lookup, "x")):
                    asked.append((changelist(model_admin), f"{path}__{lookup}", value))
    return asked


@pytest.fixture
def rows():
    """A schedule with a ping URL, a run of it, and a lease of that run held by a process:
    a row on each change list that a filter on the secret could keep or drop."""
    schedule = ScheduleFactory(ping_url=URL)
    schedule.calendars.create(name="weekdays")
    LeaseFactory(run=RunFactory(schedule=schedule, status=Run.Status.RUNNING, attempt=1))
    return schedule


@pytest.fixture(params=["viewer", "superuser"])
def user_client(request, client):
    if request.param == "superuser":
        user = User.objects.create_superuser("root", password="pw")
    else:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        codenames = ["view_schedule", "view_run", "view_lease", "view_schedulerprocess"]
        user.user_permissions.add(
            *Permission.objects.filter(
                codename__in=[*codenames, "view_calendar", "view_concurrencylimit"]
            )
        )
    client.force_login(user)
    return client


def test_every_change_list_reaches_the_secret_by_some_path():
    # The paths the next test tries: one from each change list of the app at least.
    paths = {
        model_admin.model: [path for path, _ in secret_paths(model_admin.model)]
        for model_admin in PERIODIC_ADMINS
    }
    assert "ping_url" in paths[Schedule]
    assert "schedule__ping_url" in paths[Run]
    assert "run__schedule__ping_url" in paths[Lease]
    assert "leases__run__schedule__ping_url" in paths[SchedulerProcess]
    assert all(paths.values()), paths


def test_no_lookup_on_a_secret_filters_any_change_list(user_client, rows):
    answers = {}
    for url, lookup, value in filters_on_secrets():
        answers[(url, lookup, value)] = user_client.get(url, {lookup: value}).status_code
    assert answers and set(answers.values()) == {400}, {
        asked: status for asked, status in answers.items() if status != 400
    }


def test_the_change_lists_other_filters_still_filter(user_client, rows):
    schedules = reverse("admin:django_periodic_schedule_changelist")
    runs = reverse("admin:django_periodic_run_changelist")
    assert user_client.get(schedules, {"enabled__exact": "1"}).status_code == 200
    assert user_client.get(schedules, {"name__startswith": rows.name[:3]}).status_code == 200
    assert user_client.get(runs, {"schedule": rows.pk}).context["cl"].result_count == 1


def test_a_search_field_that_reaches_a_secret_is_not_searched(admin_user):
    """A project's subclass that adds the secret to the search fields searches the others
    only: a search term would tell whether the URL holds it."""

    class SearchingScheduleAdmin(ScheduleAdmin):
        search_fields = ["name", "ping_url", "=ping_url", "^runs__schedule__ping_url"]

    ScheduleFactory(name="watched", ping_url=URL)
    model_admin = SearchingScheduleAdmin(Schedule, AdminSite(name="searching"))
    request = RequestFactory().get("/", {"q": KEY})
    request.user = admin_user
    assert model_admin.get_search_fields(request) == ["name"]
    response = model_admin.changelist_view(request)
    assert response.context_data["cl"].result_count == 0
    request = RequestFactory().get("/", {"q": "watched"})
    request.user = admin_user
    assert model_admin.changelist_view(request).context_data["cl"].result_count == 1
