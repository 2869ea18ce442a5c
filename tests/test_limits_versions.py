"""Versions of concurrency limits: every save of a limit that changes one of its fields is a
LimitVersion with its changes field by field, who made it and why, written in the save's
transaction, which keeps the limit's newest KEEP_VERSIONS; a version can be restored.

Each test reads the version table itself (oldest first), never what the save returned."""

import os
import socket
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from django_periodic.models import ConcurrencyLimit, LimitVersion, changed_by, restore_version
from tests.threads import save_together

pytestmark = pytest.mark.django_db

FIELDS = {"name": "warehouse", "max_running": 2, "per_scope": False, "description": ""}


def versions_of(limit: ConcurrencyLimit) -> list[dict]:
    """Its versions as the table holds them, oldest first."""
    rows = LimitVersion.objects.filter(limit_id=limit.pk).order_by("id")
    return list(rows.values("id", "by", "reason", "changes", "fields", "created_at"))


def new_limit(**fields) -> ConcurrencyLimit:
    return ConcurrencyLimit.objects.create(**{**FIELDS, **fields})


def edited(limit: ConcurrencyLimit, times: int) -> None:
    """``times`` saves, each with one more slot."""
    for _ in range(times):
        limit.max_running += 1
        limit.save()


# -- save() ------------------------------------------------------------------------------------


def test_creating_a_limit_makes_its_first_version_with_every_field_from_none():
    with changed_by("alice", "the warehouse is small"):
        limit = new_limit()
    (version,) = versions_of(limit)
    assert (version["by"], version["reason"]) == ("alice", "the warehouse is small")
    assert version["changes"] == {name: [None, value] for name, value in FIELDS.items()}
    assert version["fields"] == FIELDS


def test_a_save_makes_one_version_with_the_changed_fields_old_and_new():
    limit = new_limit()
    with changed_by("bob", "the new replica"):
        limit.max_running = 4
        limit.description = "two replicas"
        limit.save()
    edit = versions_of(limit)[-1]
    assert (edit["by"], edit["reason"]) == ("bob", "the new replica")
    assert edit["changes"] == {"max_running": [2, 4], "description": ["", "two replicas"]}
    assert edit["fields"] == {**FIELDS, "max_running": 4, "description": "two replicas"}


def test_a_save_without_changed_by_is_by_this_process():
    limit = new_limit()
    limit.per_scope = True
    limit.save()
    edit = versions_of(limit)[-1]
    assert (edit["by"], edit["reason"]) == (f"{os.getpid()}@{socket.gethostname()}", "")


def test_a_save_that_changes_nothing_makes_no_version():
    limit = new_limit()
    limit.save()
    ConcurrencyLimit.objects.get(pk=limit.pk).save()
    assert len(versions_of(limit)) == 1


def test_a_save_diffs_against_the_row_not_the_instance_as_loaded():
    limit = new_limit()
    ConcurrencyLimit.objects.filter(pk=limit.pk).update(max_running=5)  # no version
    limit.max_running = 3  # loaded as 2
    limit.save()
    assert [v["changes"] for v in versions_of(limit)[1:]] == [{"max_running": [5, 3]}]


def test_a_save_of_some_fields_records_only_what_it_wrote():
    limit = new_limit()
    limit.max_running, limit.description = 9, "only this"
    limit.save(update_fields=["description"])
    edit = versions_of(limit)[-1]
    assert edit["changes"] == {"description": ["", "only this"]}
    assert edit["fields"]["max_running"] == 2


def test_update_makes_no_version():
    limit = new_limit()
    ConcurrencyLimit.objects.filter(pk=limit.pk).update(max_running=7)
    assert len(versions_of(limit)) == 1


def test_a_save_that_fails_records_nothing():
    new_limit(name="taken")
    limit = new_limit()
    limit.name = "taken"
    with pytest.raises(IntegrityError), transaction.atomic():
        limit.save()
    assert len(versions_of(limit)) == 1


def test_a_save_rolled_back_takes_its_version_with_it():
    limit = new_limit()
    with pytest.raises(RuntimeError), transaction.atomic():
        limit.max_running = 3
        limit.save()
        assert len(versions_of(limit)) == 2
        raise RuntimeError
    assert len(versions_of(limit)) == 1


def test_deleting_a_limit_deletes_its_versions():
    limit = new_limit()
    edited(limit, 2)
    limit.delete()
    assert not LimitVersion.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_edits_each_diff_against_the_one_before(postgres):
    """Two threads, each its own connection, save the same loaded limit at once: the second
    waits on the first's row lock, and its version's old value is the first's new one."""
    limit = new_limit(max_running=1)
    save_together(
        ConcurrencyLimit,
        limit.pk,
        {f"editor-{n}": {"max_running": n} for n in (2, 3)},
    )
    first, second = (v["changes"]["max_running"] for v in versions_of(limit)[1:])
    assert first[0] == 1 and second[0] == first[1]
    assert ConcurrencyLimit.objects.get(pk=limit.pk).max_running == second[1]


# -- retention -------------------------------------------------------------------------------


def test_a_save_deletes_its_limits_versions_past_keep_versions(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 2}
    busy, quiet = new_limit(), new_limit(name="quiet")
    edited(busy, 4)  # five versions written, each trimming the older ones
    assert [v["changes"]["max_running"][1] for v in versions_of(busy)] == [5, 6]
    assert len(versions_of(quiet)) == 1


def test_a_save_trims_in_one_statement(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 1}
    limit = new_limit()
    limit.max_running = 3
    with CaptureQueriesContext(connection) as captured:
        limit.save()
    deletes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 1 and "periodic_limitversion" in deletes[0]
    assert [v["changes"] for v in versions_of(limit)] == [{"max_running": [2, 3]}]


def test_a_save_rolled_back_trims_nothing(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    limit = new_limit()
    edited(limit, 2)
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 1}
    with pytest.raises(RuntimeError), transaction.atomic():
        edited(limit, 1)
        assert len(versions_of(limit)) == 1  # trimmed with the write...
        raise RuntimeError
    assert len(versions_of(limit)) == 3  # ...and back with its rollback


def test_without_keep_versions_every_version_is_kept(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    limit = new_limit()
    edited(limit, 5)
    assert len(versions_of(limit)) == 6


def test_prune_runs_deletes_the_versions_past_a_lowered_keep_versions(settings):
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": None}
    limit, other = new_limit(), new_limit(name="other")
    edited(limit, 2)
    newest = versions_of(limit)[-1]["id"]
    settings.DJANGO_PERIODIC = {"KEEP_VERSIONS": 1}
    call_command("prune_runs", "--dry-run", stdout=StringIO())
    assert len(versions_of(limit)) == 3
    out = StringIO()
    call_command("prune_runs", stdout=out)
    assert "Deleted 2 versions; kept the newest 1 of each schedule and limit" in out.getvalue()
    assert [v["id"] for v in versions_of(limit)] == [newest]
    assert len(versions_of(other)) == 1


# -- restoring -------------------------------------------------------------------------------


def test_restoring_a_version_writes_its_fields_back_as_a_new_version():
    limit = new_limit()
    first = LimitVersion.objects.get(limit=limit)
    limit.max_running, limit.per_scope, limit.description = 8, True, "per tenant"
    limit.save()
    restored = restore_version(first, by="erin")
    stored = ConcurrencyLimit.objects.filter(pk=limit.pk).values(*FIELDS).get()
    assert stored == FIELDS
    assert isinstance(restored, ConcurrencyLimit) and restored.max_running == 2
    version = versions_of(limit)[-1]
    assert version["by"] == "erin"
    assert version["reason"] == (
        f"Restored the version of {first.created_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    assert version["changes"] == {
        "max_running": [8, 2],
        "per_scope": [True, False],
        "description": ["per tenant", ""],
    }


def test_a_restore_that_no_longer_validates_saves_nothing():
    limit = new_limit()
    first = LimitVersion.objects.get(limit=limit)
    limit.name = "renamed"
    limit.save()
    new_limit(name="warehouse")  # its old name, taken since
    with pytest.raises(ValidationError) as raised:
        restore_version(first)
    assert "name" in raised.value.message_dict
    assert ConcurrencyLimit.objects.get(pk=limit.pk).name == "renamed"
    assert len(versions_of(limit)) == 2
