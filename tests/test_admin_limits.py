"""Concurrency limits in the admin: the list's counts of holders and waiting runs, a limit's
page, its versions (an edit's, the history page, "Restore this version"), a protected
delete, the schedule form and filter, a held run's release, and the overview's flag for a
limit that stays full.

The runs are recorded through the ORM as planning records them (``Run.for_schedule`` holds
a run of a limited schedule) and made holders by hand; the pages are read as HTML."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic.db import clock
from django_periodic.models import ConcurrencyLimit, LimitVersion, Run, Schedule, changed_by
from tests.factories import ScheduleFactory, schedule_form_data
from tests.helpers import run_url
from tests.test_admin_permissions import staff

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:django_periodic_concurrencylimit_changelist")


def limit_url(limit: ConcurrencyLimit, view: str = "change") -> str:
    return reverse(f"admin:django_periodic_concurrencylimit_{view}", args=[limit.pk])


def held_run(limit: ConcurrencyLimit, minutes_ago: int, **fields) -> Run:
    """A run of a schedule of its own naming ``limit``, recorded held, as planning does."""
    schedule = ScheduleFactory(concurrency_limit=limit)
    run = Run.for_schedule(schedule, clock.now() - timedelta(minutes=minutes_ago), **fields)
    run.save()
    return run


def holder(limit: ConcurrencyLimit, minutes_ago: int, status: str = "pending") -> Run:
    """A run admitted by its limit (its release back), pending or running."""
    run = held_run(limit, minutes_ago)
    Run.objects.filter(pk=run.pk).update(release_at=None, held_release_at=None, status=status)
    return run


def ended(limit: ConcurrencyLimit, minutes_ago: int) -> Run:
    run = holder(limit, minutes_ago)
    Run.objects.filter(pk=run.pk).update(status="succeeded", finished_at=clock.now())
    return run


def row(html: str, name: str) -> str:
    """The change list's row of the limit named ``name``."""
    rows = re.findall(r"<tr>.*?</tr>", html, re.S)
    [found] = [r for r in rows if f">{name}</a>" in r]
    return found


def cell(row_html: str, column: str) -> str:
    return re.search(rf'<td class="field-{column}">(.*?)</td>', row_html, re.S).group(1)


@pytest.fixture
def busy():
    """A limit of 2 slots with 2 holders (one running), 3 runs waiting and one run ended."""
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    holders = [holder(limit, 10, "running"), holder(limit, 9)]
    waiting = [held_run(limit, minutes) for minutes in (8, 7, 6)]
    ended(limit, 20)
    return limit, holders, waiting


# -- the list -------------------------------------------------------------------------------


def test_the_list_counts_holders_and_waiting_runs_of_each_limit(admin_client, busy):
    ConcurrencyLimit.objects.create(name="idle api", max_running=5, per_scope=True)
    html = admin_client.get(LIST_URL).content.decode()
    busy_row, idle_row = row(html, "warehouse db"), row(html, "idle api")
    assert (cell(busy_row, "max_running"), cell(busy_row, "holding")) == ("2", "2")
    assert cell(busy_row, "waiting") == "3"
    assert (cell(idle_row, "holding"), cell(idle_row, "waiting")) == ("0", "0")


@pytest.mark.parametrize("column", ["4", "5"])  # holding, waiting
def test_the_list_sorts_by_holding_and_by_waiting(admin_client, busy, column):
    ConcurrencyLimit.objects.create(name="idle api", max_running=5)
    ascending = admin_client.get(LIST_URL, {"o": column}).content.decode()
    assert ascending.index("idle api") < ascending.index("warehouse db")
    descending = admin_client.get(LIST_URL, {"o": f"-{column}"}).content.decode()
    assert descending.index("warehouse db") < descending.index("idle api")


def test_the_list_is_searched_by_name(admin_client, busy):
    ConcurrencyLimit.objects.create(name="idle api", max_running=5)
    html = admin_client.get(LIST_URL, {"q": "api"}).content.decode()
    assert "idle api" in html
    assert "warehouse db" not in html


def queries(client, url: str) -> int:
    client.get(url)  # warm caches (content types, the session) first
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


def test_the_list_costs_the_same_queries_for_1_limit_as_for_5(admin_client):
    def add_limits(count: int) -> None:
        for _ in range(count):
            limit = ConcurrencyLimit.objects.create(
                name=f"limit {ConcurrencyLimit.objects.count()}", max_running=1
            )
            holder(limit, 5)
            held_run(limit, 4)

    add_limits(1)
    one = queries(admin_client, LIST_URL)
    add_limits(4)
    assert queries(admin_client, LIST_URL) == one


# -- a limit's page ---------------------------------------------------------------------------


def test_its_page_lists_its_holders_its_waiting_runs_and_its_schedules(admin_client, busy):
    limit, holders, waiting = busy
    html = admin_client.get(limit_url(limit)).content.decode()
    holding = re.search(r'class="[^"]*field-holders.*?</ul>', html, re.S).group(0)
    assert all(run_url(run) in holding for run in holders)
    listed = re.search(r'class="[^"]*field-waiting_runs.*?</ul>', html, re.S).group(0)
    # Oldest plan time first; neither a holder nor an ended run among them.
    assert re.findall(r'href="([^"]+)"', listed) == [run_url(run) for run in waiting]
    schedules = re.search(r'class="[^"]*field-used_by.*?</div>\s*</div>', html, re.S).group(0)
    for schedule in Schedule.objects.filter(concurrency_limit=limit):
        url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
        assert f'href="{url}"' in schedules


def test_its_page_lists_20_waiting_runs_and_says_how_many_more(admin_client):
    limit = ConcurrencyLimit.objects.create(name="mail", max_running=1)
    oldest = [held_run(limit, minutes) for minutes in range(30, 0, -1)]
    html = admin_client.get(limit_url(limit)).content.decode()
    listed = re.search(r'class="[^"]*field-waiting_runs.*?</ul>(.*?)</div>', html, re.S)
    assert re.findall(r'href="([^"]+)"', listed.group(0)) == [run_url(r) for r in oldest[:20]]
    assert "and 10 more" in listed.group(1)


def test_a_new_limit_is_added_on_its_page(admin_client):
    response = admin_client.post(
        reverse("admin:django_periodic_concurrencylimit_add"),
        {"name": "reports", "max_running": "3", "description": "the report server"},
    )
    assert response.status_code == 302
    limit = ConcurrencyLimit.objects.get()
    assert (limit.name, limit.max_running, limit.per_scope) == ("reports", 3, False)


def test_a_user_who_may_view_only_limits_sees_how_many_runs_and_schedules_not_which(client, busy):
    limit, _, _ = busy
    staff(client, "view_concurrencylimit")
    html = client.get(limit_url(limit)).content.decode()
    assert "/run/" not in html
    assert "/schedule/" not in html
    assert re.search(r'class="[^"]*field-holding.*?<div class="readonly">2</div>', html, re.S)
    assert re.search(r'class="[^"]*field-waiting.*?<div class="readonly">3</div>', html, re.S)
    assert "6 schedules" in html  # one per run: two holders, three waiting, one ended


# -- its versions -----------------------------------------------------------------------------


def versions_of(limit: ConcurrencyLimit) -> list[LimitVersion]:
    """Oldest first, read from the table."""
    return list(LimitVersion.objects.filter(limit_id=limit.pk).order_by("id"))


def limit_form(limit: ConcurrencyLimit, **changed) -> dict[str, str]:
    """The change form of ``limit`` as it stands, with ``changed`` fields."""
    data = {"name": limit.name, "max_running": str(limit.max_running)}
    data |= {"description": limit.description, **changed}
    if limit.per_scope:
        data["per_scope"] = "on"
    return data


def test_an_admin_edit_is_a_version_by_the_user_with_the_reason(admin_client):
    response = admin_client.post(
        reverse("admin:django_periodic_concurrencylimit_add"),
        {"name": "reports", "max_running": "3", "version_reason": "the report server"},
    )
    assert response.status_code == 302
    limit = ConcurrencyLimit.objects.get()
    data = limit_form(limit, max_running="5", version_reason="a bigger server")
    assert admin_client.post(limit_url(limit), data).status_code == 302
    created, edited = versions_of(limit)
    assert (created.by, created.reason) == ("admin", "the report server")
    assert created.changes["max_running"] == [None, 3]
    assert (edited.by, edited.reason) == ("admin", "a bigger server")
    assert edited.changes == {"max_running": [3, 5]}


def test_an_admin_save_of_an_unchanged_form_makes_no_version(admin_client):
    limit = ConcurrencyLimit.objects.create(name="reports", max_running=3)
    data = limit_form(limit, version_reason="nothing, really")
    assert admin_client.post(limit_url(limit), data).status_code == 302
    assert len(versions_of(limit)) == 1


def test_the_history_page_shows_who_when_why_and_the_diff(admin_client):
    with changed_by("alice", "first"):
        limit = ConcurrencyLimit.objects.create(name="reports", max_running=1)
    with changed_by("bob", "the new replica"):
        limit.max_running = 4
        limit.save()
    html = admin_client.get(limit_url(limit, "history")).content.decode()
    rows = re.findall(r'<tr class="periodic-version".*?</tr>', html, re.S)
    assert len(rows) == 2
    newest, first = rows
    assert '<td class="periodic-version-by">bob</td>' in newest
    assert '<td class="periodic-version-reason">the new replica</td>' in newest
    assert re.search(r"<code>max_running</code>: .*?>1</span> &rarr; .*?>4</span>", newest)
    assert '<td class="periodic-version-by">alice</td>' in first
    # The newest is what the limit is now: only older ones are offered to restore.
    restore = reverse(
        "admin:django_periodic_concurrencylimit_restore", args=[limit.pk, versions_of(limit)[0].pk]
    )
    assert "periodic-restore" not in newest and f'action="{restore}"' in first


def test_restore_in_the_admin_restores_as_a_version_by_the_user(admin_client):
    limit = ConcurrencyLimit.objects.create(name="reports", max_running=1)
    limit.max_running, limit.description = 6, "six"
    limit.save()
    first = versions_of(limit)[0]
    restore = reverse("admin:django_periodic_concurrencylimit_restore", args=[limit.pk, first.pk])
    assert admin_client.get(restore).status_code == 405
    response = admin_client.post(restore, follow=True)
    shown = [str(message) for message in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("Restored the version of ")
    stored = ConcurrencyLimit.objects.filter(pk=limit.pk).values("max_running", "description")
    assert stored.get() == {"max_running": 1, "description": ""}
    restored = versions_of(limit)[-1]
    assert restored.by == "admin" and restored.reason.startswith("Restored the version of ")
    assert restored.changes == {"max_running": [6, 1], "description": ["six", ""]}


def test_a_restore_in_the_admin_that_no_longer_validates_says_why_and_saves_nothing(
    admin_client,
):
    limit = ConcurrencyLimit.objects.create(name="reports", max_running=1)
    first = versions_of(limit)[0]
    limit.name = "renamed"
    limit.save()
    ConcurrencyLimit.objects.create(name="reports", max_running=1)  # its old name, taken
    restore = reverse("admin:django_periodic_concurrencylimit_restore", args=[limit.pk, first.pk])
    response = admin_client.post(restore, follow=True)
    shown = [str(message) for message in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("Not restored: name: ")
    assert ConcurrencyLimit.objects.get(pk=limit.pk).name == "renamed"
    assert len(versions_of(limit)) == 2


def test_a_user_who_may_only_view_sees_the_history_but_may_not_restore(client):
    limit = ConcurrencyLimit.objects.create(name="reports", max_running=1)
    limit.max_running = 2
    limit.save()
    staff(client, "view_concurrencylimit")
    assert "version_reason" not in client.get(limit_url(limit)).content.decode()
    html = client.get(limit_url(limit, "history")).content.decode()
    assert html.count('<tr class="periodic-version"') == 2
    assert "periodic-restore" not in html
    first = versions_of(limit)[0]
    restore = reverse("admin:django_periodic_concurrencylimit_restore", args=[limit.pk, first.pk])
    assert client.post(restore).status_code == 403
    assert ConcurrencyLimit.objects.get(pk=limit.pk).max_running == 2


def test_a_user_who_may_only_add_limits_gives_the_first_version_its_reason(client):
    staff(client, "add_concurrencylimit", "view_concurrencylimit")
    add = reverse("admin:django_periodic_concurrencylimit_add")
    data = {"name": "reports", "max_running": "3", "version_reason": "the report server"}
    assert client.post(add, data).status_code == 302
    (version,) = versions_of(ConcurrencyLimit.objects.get())
    assert (version.by, version.reason) == ("staff", "the report server")


def test_the_history_page_costs_the_same_queries_for_few_or_many_versions(admin_client):
    def queries_for(edits: int) -> int:
        limit = ConcurrencyLimit.objects.create(name=f"limit {edits}", max_running=1)
        for slots in range(2, 2 + edits):
            limit.max_running = slots
            limit.save()
        return queries(admin_client, limit_url(limit, "history"))

    assert queries_for(1) == queries_for(30)


# -- deleting ---------------------------------------------------------------------------------


def test_a_limit_that_schedules_name_is_not_deleted_and_the_page_says_why(admin_client, busy):
    limit, _, _ = busy
    page = admin_client.get(limit_url(limit, "delete"))
    assert page.status_code == 200
    assert "would require deleting the following protected related objects" in (
        page.content.decode()
    )
    response = admin_client.post(limit_url(limit, "delete"), {"post": "yes"})
    assert response.status_code == 200
    assert ConcurrencyLimit.objects.filter(pk=limit.pk).exists()


def test_deleting_limits_in_bulk_that_schedules_name_is_refused(admin_client, busy):
    limit, _, _ = busy
    response = admin_client.post(
        LIST_URL, {"action": "delete_selected", "_selected_action": [limit.pk], "post": "yes"}
    )
    assert response.status_code == 200
    assert "protected related objects" in response.content.decode()
    assert ConcurrencyLimit.objects.filter(pk=limit.pk).exists()


def test_a_limit_no_schedule_names_is_deleted(admin_client):
    limit = ConcurrencyLimit.objects.create(name="unused", max_running=1)
    response = admin_client.post(limit_url(limit, "delete"), {"post": "yes"})
    assert response.status_code == 302
    assert not ConcurrencyLimit.objects.exists()


# -- the schedule form and list --------------------------------------------------------------

SCHEDULE_ADD_URL = reverse("admin:django_periodic_schedule_add")
SCHEDULE_LIST_URL = reverse("admin:django_periodic_schedule_changelist")


def test_the_schedule_form_offers_the_limits_and_a_link_to_add_one(admin_client):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    html = admin_client.get(SCHEDULE_ADD_URL).content.decode()
    select = re.search(r'<select name="concurrency_limit".*?</select>', html, re.S).group(0)
    assert f'<option value="{limit.pk}">warehouse db</option>' in select
    assert 'id="add_id_concurrency_limit"' in html


def test_a_schedule_saved_through_its_form_names_its_limit(admin_client):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    data = schedule_form_data(name="nightly load", concurrency_limit=str(limit.pk))
    response = admin_client.post(SCHEDULE_ADD_URL, data)
    assert response.status_code == 302
    assert Schedule.objects.get(name="nightly load").concurrency_limit == limit


def test_the_schedule_list_is_filtered_by_limit(admin_client):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    ScheduleFactory(name="limited one", concurrency_limit=limit)
    ScheduleFactory(name="free one")
    params = {"concurrency_limit__id__exact": limit.pk}
    html = admin_client.get(SCHEDULE_LIST_URL, params).content.decode()
    assert "limited one" in html
    assert "free one" not in html
    html = admin_client.get(SCHEDULE_LIST_URL, {"concurrency_limit__isnull": "True"}).content
    assert "free one" in html.decode()
    assert "limited one" not in html.decode()


# -- runs -------------------------------------------------------------------------------------

RUN_LIST_URL = reverse("admin:django_periodic_run_changelist")


def test_a_held_run_shows_what_it_waits_for_not_a_far_release_time(admin_client, busy):
    limit, _, waiting = busy
    html = admin_client.get(RUN_LIST_URL).content.decode()
    assert "8999" not in html
    assert html.count("waiting for “warehouse db”") == len(waiting)
    page = admin_client.get(run_url(waiting[0])).content.decode()
    assert "8999" not in page
    assert "waiting for “warehouse db”" in page
    assert f'href="{limit_url(limit)}"' in page  # its limit, linked


def test_an_admitted_run_shows_its_release_time_and_its_limit(admin_client, busy):
    limit, holders, _ = busy
    page = admin_client.get(run_url(holders[0])).content.decode()
    assert "waiting for" not in page
    assert f'href="{limit_url(limit)}"' in page


def test_a_held_run_cancelled_before_its_limit_admitted_it_shows_no_release(admin_client):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=1)
    run = held_run(limit, 5)
    Run.objects.filter(pk=run.pk).update(status="cancelled", finished_at=clock.now())
    page = admin_client.get(run_url(run)).content.decode()
    assert "8999" not in page
    assert "waiting for" not in page


# -- the overview -----------------------------------------------------------------------------

OVERVIEW_URL = reverse("admin:django_periodic_schedule_overview")


def attention(client) -> str:
    html = client.get(OVERVIEW_URL).content.decode()
    return re.search(r'<section id="overview-attention".*?</section>', html, re.S).group(0)


def test_the_overview_flags_a_limit_full_with_a_run_waiting_over_a_minute(admin_client):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    holder(limit, 10, "running")
    holder(limit, 9)
    held_run(limit, 5)
    held_run(limit, 0)
    html = attention(admin_client)
    assert f'<a href="{limit_url(limit)}">warehouse db</a>' in html
    assert "Full: 2 of 2 slots held, 2 waiting." in html


@pytest.mark.parametrize(
    ("holders", "waiting_since"),
    [
        (1, 5),  # a slot free: the next admission takes the run
        (2, 0),  # full, but its run has waited less than a minute
    ],
)
def test_the_overview_does_not_flag_a_limit_with_a_free_slot_or_a_short_wait(
    admin_client, holders, waiting_since
):
    limit = ConcurrencyLimit.objects.create(name="warehouse db", max_running=2)
    for minutes in range(holders):
        holder(limit, 10 + minutes)
    held_run(limit, waiting_since)
    assert "warehouse db" not in attention(admin_client)


def test_the_overview_flags_a_per_scope_limit_only_for_a_key_that_stays_full(admin_client):
    limit = ConcurrencyLimit.objects.create(name="tenant", max_running=1, per_scope=True)
    Run.objects.filter(pk=held_run(limit, 10, scope="acme").pk).update(
        release_at=None, held_release_at=None
    )
    held_run(limit, 5, scope="globex")  # its own key has a free slot
    assert "tenant" not in attention(admin_client)
    held_run(limit, 5, scope="acme")  # its key's one slot is held
    html = attention(admin_client)
    assert f'<a href="{limit_url(limit)}">tenant</a>' in html
    assert "Full for a scope key (1 per key): 1 held in all, 2 waiting." in html


def test_the_overview_reads_every_full_limit_in_one_query(admin_client):
    def add_full_limits(count: int) -> None:
        for _ in range(count):
            name = f"limit {ConcurrencyLimit.objects.count()}"
            limit = ConcurrencyLimit.objects.create(name=name, max_running=1)
            holder(limit, 10)
            held_run(limit, 5)

    add_full_limits(1)
    one = queries(admin_client, OVERVIEW_URL)
    add_full_limits(4)
    assert queries(admin_client, OVERVIEW_URL) == one
    assert attention(admin_client).count("Full: 1 of 1 slots held, 1 waiting.") == 5
