from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from django_periodic.checks import (
    check_settings,
    check_supported_databases,
    sqlite_warnings,
    unsupported_errors,
)
from django_periodic.conf import get_settings


def ids(settings_value, settings):
    settings.DJANGO_PERIODIC = settings_value
    return [error.id for error in check_settings()]


def test_no_setting_and_good_settings_pass(settings):
    assert ids({}, settings) == []
    assert ids({"WORKERS": 8, "POLL_INTERVAL": 2.5, "SHUTDOWN_GRACE": timedelta(1)}, settings) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1, 2], ["django_periodic.E001"]),
        ({"WORKRES": 4}, ["django_periodic.E002"]),
        ({"WORKERS": "4"}, ["django_periodic.E003"]),
        ({"WORKERS": 0}, ["django_periodic.E003"]),
        ({"POLL_INTERVAL": -1}, ["django_periodic.E003"]),
        ({"POLL_INTERVAL": "5s"}, ["django_periodic.E003"]),
        ({"HEARTBEAT_INTERVAL": True}, ["django_periodic.E003"]),
        ({"POLL_INTERVAL": 0}, ["django_periodic.E003"]),
        ({"PLAN_AHEAD": -1}, ["django_periodic.E003"]),
    ],
)
def test_bad_settings_are_reported_with_stable_ids(settings, value, expected):
    assert ids(value, settings) == expected


@pytest.mark.parametrize(
    "hosts",
    [
        "hc-ping.com",  # a string, not a list of them
        ["https://hc-ping.com/0b6f8f1e"],  # a URL: its key is not repeated in the message
        ["hc-ping.com:443"],
        ["user@hc-ping.com"],
        [""],
        [42],
        {"hc-ping.com": True},
    ],
)
def test_ping_hosts_of_the_wrong_type_are_reported_without_repeating_them(settings, hosts):
    settings.DJANGO_PERIODIC = {"PING_HOSTS": hosts}
    (error,) = check_settings()
    assert error.id == "django_periodic.E003"
    assert error.msg.startswith("DJANGO_PERIODIC['PING_HOSTS'] must ")
    assert "0b6f8f1e" not in error.msg
    assert get_settings().PING_HOSTS is None  # read as the default meanwhile: any host


def test_ping_hosts_are_host_names_as_allowed_hosts_has_them(settings):
    hosts = ["hc-ping.com", ".Example.com", "127.0.0.1", "[::1]", "*"]
    assert ids({"PING_HOSTS": hosts}, settings) == []
    assert get_settings().PING_HOSTS == ("hc-ping.com", ".example.com", "127.0.0.1", "[::1]", "*")
    assert ids({"PING_HOSTS": None}, settings) == ids({"PING_HOSTS": ()}, settings) == []


def test_planning_ahead_may_be_turned_off_with_zero(settings):
    assert ids({"PLAN_AHEAD": 0}, settings) == []


def test_durations_accept_seconds_or_timedelta(settings):
    settings.DJANGO_PERIODIC = {"POLL_INTERVAL": 3, "SWEEP_INTERVAL": timedelta(minutes=1)}
    effective = get_settings()
    assert timedelta(seconds=3) == effective.POLL_INTERVAL
    assert timedelta(minutes=1) == effective.SWEEP_INTERVAL
    assert effective.WORKERS == 4


def test_sqlite_without_immediate_transactions_is_warned_about():
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}
    warnings = sqlite_warnings(
        {"default": sqlite, "other": {**sqlite, "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}
    )
    assert [w.id for w in warnings] == ["django_periodic.W001"]
    assert "'default'" in warnings[0].msg


@pytest.mark.django_db  # Django 6's check command also runs the database checks
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_without_immediate_transactions_shows_in_manage_py_check(settings):
    loose = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    settings.DATABASES = {**settings.DATABASES, "loose": loose}
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "django_periodic.W001" in out.getvalue() + err.getvalue()
    assert "'loose'" in out.getvalue() + err.getvalue()


@pytest.mark.parametrize("value", [1, 0.001, timedelta(minutes=5), timedelta(days=36525)])
def test_a_min_interval_the_database_accepts_passes(settings, value):
    assert ids({"MIN_INTERVAL": value}, settings) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0005, ["django_periodic.E006"]),  # below the database's floor of 1 ms
        (timedelta(days=36526), ["django_periodic.E006"]),  # above the longest interval
        (0, ["django_periodic.E003"]),
        ("1s", ["django_periodic.E003"]),
    ],
)
def test_a_min_interval_the_database_would_refuse_is_reported(settings, value, expected):
    assert ids({"MIN_INTERVAL": value}, settings) == expected


def test_the_min_interval_error_says_the_range(settings):
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": 0.0005}
    (error,) = check_settings()
    assert error.msg == (
        "DJANGO_PERIODIC['MIN_INTERVAL'] must be from 1 ms to 36525 days (the intervals the "
        "database accepts), not 500 µs."
    )


def test_min_interval_defaults_to_a_second(settings):
    settings.DJANGO_PERIODIC = {}
    assert timedelta(seconds=1) == get_settings().MIN_INTERVAL
    settings.DJANGO_PERIODIC = {"MIN_INTERVAL": 0.25}
    assert timedelta(milliseconds=250) == get_settings().MIN_INTERVAL


@pytest.mark.parametrize(
    "engine",
    [
        "django.db.backends.dummy",  # loads, but is neither PostgreSQL nor SQLite
        "django.db.backends.mysql",  # not installed here: another database all the same
        "django.db.backends.oracle",
        "no.such.backend",
    ],
)
def test_a_database_other_than_postgresql_or_sqlite_is_an_error(engine):
    errors = unsupported_errors({"legacy": {"ENGINE": engine}})
    assert [e.id for e in errors] == ["django_periodic.E013"]
    assert "'legacy'" in errors[0].msg
    assert "PostgreSQL" in errors[0].msg and "SQLite" in errors[0].msg


def test_postgresql_and_sqlite_are_supported():
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}
    postgresql = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    assert unsupported_errors({"default": sqlite, "pg": postgresql}) == []


class _ElsewhereRouter:
    """Keeps the app's tables off the alias "legacy"."""

    def allow_migrate(self, db, app_label, **hints):
        return False if db == "legacy" and app_label == "django_periodic" else None


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_only_the_databases_the_app_may_be_migrated_to_are_checked(settings):
    legacy = {"ENGINE": "django.db.backends.dummy"}
    settings.DATABASES = {**settings.DATABASES, "legacy": legacy}
    assert [e.id for e in check_supported_databases()] == ["django_periodic.E013"]
    settings.DATABASE_ROUTERS = [f"{__name__}._ElsewhereRouter"]
    assert check_supported_databases() == []
