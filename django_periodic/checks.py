"""System checks for ``settings.DJANGO_PERIODIC`` (ids ``django_periodic.E0xx``)."""

from collections.abc import Callable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, router

from django_periodic import taskbackends
from django_periodic.conf import SETTING_NAME, InvalidSetting, Refusal, parse
from django_periodic.contrib import opentelemetry, sentry
from django_periodic.db import features_of, pooling
from django_periodic.engine.planning import code_schedules
from django_periodic.models import Calendar, Schedule
from django_periodic.timing import business_days


# Untagged, so every command that runs checks shows it (runserver, run_scheduler, check);
# the database tag would keep it for `check --database` only. It reads only settings.
@register()
def check_sqlite_transactions(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[Warning]:
    """SQLite must start write transactions at once, or planners can plan the same fire."""
    return sqlite_warnings(settings.DATABASES)


def sqlite_warnings(databases: dict[str, dict[str, Any]]) -> list[Warning]:
    warnings = []
    for alias, config in databases.items():
        immediate = features_of(config).needs_immediate_transactions
        mode = config.get("OPTIONS", {}).get("transaction_mode", "")
        if immediate and str(mode).upper() != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"Database {alias!r} is SQLite without transaction_mode 'IMMEDIATE'.",
                    hint="Set DATABASES[...]['OPTIONS']['transaction_mode'] = 'IMMEDIATE', so "
                    "that a scheduler and the web process never plan or write over each other.",
                    id="django_periodic.W001",
                )
            )
    return warnings


@register(Tags.compatibility)
def check_supported_databases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error]:
    """The app's tables must be on PostgreSQL or SQLite: the ledger's statements are tested
    on these two only (docs/deployment.md, "Databases")."""
    return unsupported_errors(
        {
            alias: config
            for alias, config in settings.DATABASES.items()
            if router.allow_migrate_model(alias, Schedule)
        }
    )


def unsupported_errors(databases: dict[str, dict[str, Any]]) -> list[Error]:
    """An error for each of ``databases`` (the aliases the app's tables may be migrated to)
    that is neither PostgreSQL nor SQLite."""
    return [
        Error(
            f"Database {alias!r} ({config.get('ENGINE', 'no ENGINE')}) is neither PostgreSQL "
            "nor SQLite: django_periodic supports only these two, the only databases its "
            "ledger's statements are tested on.",
            hint="Use PostgreSQL (or SQLite for development and small single-host installs); "
            "if the app's tables are not on this database, say so with a database router "
            "(allow_migrate).",
            id="django_periodic.E013",
        )
        for alias, config in databases.items()
        if not features_of(config).supported
    ]


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Error]:
    """Each key of the setting must be known, of its type and within its range
    (``conf.parse``, ``conf.RANGES``)."""
    configured = getattr(settings, SETTING_NAME, None)
    if configured is None:
        return []
    if not isinstance(configured, dict):
        return [
            Error(
                f"{SETTING_NAME} must be a dict, not {type(configured).__name__}.",
                id="django_periodic.E001",
            )
        ]
    errors = []
    for key, value in configured.items():
        try:
            parse(key, value)
        except InvalidSetting as refused:
            errors.append(
                Error(f"{SETTING_NAME}[{key!r}] {refused}", id=_error_id(key, refused.refusal))
            )
    return errors


def _error_id(key: str, refusal: Refusal) -> str:
    """Each rule its own id; the floors of MIN_INTERVAL and ALERT_INTERVAL kept theirs."""
    if refusal is Refusal.UNKNOWN:
        return "django_periodic.E002"
    if refusal is Refusal.WRONG:
        return "django_periodic.E003"
    if key == "MIN_INTERVAL" and refusal is not Refusal.NOT_FINITE:
        # The intervals the database accepts.
        return "django_periodic.E006"
    if key == "ALERT_INTERVAL" and refusal is Refusal.BELOW:
        # Judging which schedules need attention is one query: not one per tick.
        return "django_periodic.E007"
    # Infinite, NaN, or past the ceiling (so past what the loop can add to a time).
    return "django_periodic.E010"


@register(Tags.compatibility)
def check_tasks_backend(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error]:
    """``TASKS_BACKEND`` needs Django's tasks framework and must name one of its backends."""
    configured = getattr(settings, SETTING_NAME, None)
    alias = configured.get("TASKS_BACKEND") if isinstance(configured, dict) else None
    if not isinstance(alias, str) or not alias:
        return []  # unset, or already reported by check_settings
    error = taskbackends.alias_error(alias)
    if error is None:
        return []
    return [Error(f"{SETTING_NAME}['TASKS_BACKEND']: {error}", id="django_periodic.E005")]


@register(Tags.models)
def check_code_schedules(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error]:
    """Each schedule defined with ``@job(...)`` must be a valid schedule (no queries)."""
    errors = []
    for name, job in code_schedules.code_defined_jobs().items():
        try:
            schedule = Schedule(name=name, **code_schedules.code_defined_values(job))
            schedule.clean_fields()
            schedule.clean()
        except (TypeError, ValidationError) as exc:
            errors.append(
                Error(
                    f"The schedule that @job defines for {name!r} is not valid: {exc}",
                    obj=job.defined_in,
                    id="django_periodic.E004",
                )
            )
    return errors


@register(Tags.compatibility)
def check_retention(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Warning]:
    """``KEEP_FAILED_RUNS_FOR`` only keeps failed runs longer than a count or age rule does."""
    configured = getattr(settings, SETTING_NAME, None)
    if not isinstance(configured, dict) or configured.get("KEEP_FAILED_RUNS_FOR") is None:
        return []
    if configured.get("KEEP_RUNS") is not None or configured.get("KEEP_RUNS_FOR") is not None:
        return []
    return [
        Warning(
            f"{SETTING_NAME}['KEEP_FAILED_RUNS_FOR'] is set, but neither KEEP_RUNS nor "
            "KEEP_RUNS_FOR: runs are kept forever (unless a schedule sets its own rule).",
            hint="Set KEEP_RUNS_FOR (or KEEP_RUNS) to how long other runs are kept.",
            id="django_periodic.W002",
        )
    ]


@register(Tags.compatibility)
def check_alert_mail(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Warning]:
    """``ALERT_MAIL_ADMINS`` mails the ``ADMINS``: without any, nobody gets the mail."""
    if not _switched_on("ALERT_MAIL_ADMINS") or getattr(settings, "ADMINS", None):
        return []
    return [
        Warning(
            f"{SETTING_NAME}['ALERT_MAIL_ADMINS'] is on, but the ADMINS setting is empty: "
            "nobody is mailed when a schedule needs attention.",
            hint="Set ADMINS, or turn ALERT_MAIL_ADMINS off.",
            id="django_periodic.W003",
        )
    ]


@register(Tags.compatibility)
def check_sentry(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Error]:
    """``SENTRY_CRONS`` sends its check-ins through sentry-sdk, which must be installed."""
    return _extra_missing("SENTRY_CRONS", sentry.installed, sentry.MISSING, "sentry", "E011")


@register(Tags.compatibility)
def check_pooling(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Through a pooler in transaction mode, wake-ups need a direct connection
    (``WAKEUP_DATABASE``, db/pooling.py), and that alias must be one."""
    configured = getattr(settings, SETTING_NAME, None)
    wakeup = configured.get("WAKEUP_DATABASE") if isinstance(configured, dict) else None
    if wakeup is not None and not isinstance(wakeup, str):
        return []  # reported by check_settings
    return pooling_warnings(wakeup, settings.DATABASES)


def pooling_warnings(wakeup: str | None, databases: dict[str, dict[str, Any]]) -> list[Any]:
    if wakeup:
        return wakeup_database_errors(wakeup, databases)
    if not pooling.marked_pooled(databases.get(DEFAULT_DB_ALIAS, {})):
        return []
    return [
        Warning(
            f"Database {DEFAULT_DB_ALIAS!r} goes through a pooler in transaction mode "
            f"(DISABLE_SERVER_SIDE_CURSORS), and {SETTING_NAME}['WAKEUP_DATABASE'] is not "
            "set: schedulers get no wake-ups (run_now() and admin edits wait up to "
            "POLL_INTERVAL), and a killed scheduler's runs wait for their leases to expire.",
            hint="Add an alias of a direct connection to the same database and name it in "
            "WAKEUP_DATABASE.",
            id="django_periodic.W004",
        )
    ]


def wakeup_database_errors(alias: str, databases: dict[str, dict[str, Any]]) -> list[Error]:
    config = databases.get(alias)
    if config is None:
        error = f"names no alias of DATABASES ({', '.join(sorted(databases))})."
    elif not features_of(config).has_sessions:
        error = "must be a PostgreSQL database: only PostgreSQL has LISTEN/NOTIFY."
    elif pooling.marked_pooled(config):
        error = (
            "goes through a pooler in transaction mode (DISABLE_SERVER_SIDE_CURSORS), where "
            "LISTEN cannot work: it must be a direct connection."
        )
    else:
        return []
    return [Error(f"{SETTING_NAME}['WAKEUP_DATABASE'] {error}", id="django_periodic.E009")]


@register(Tags.database)
def check_holidays_installed(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[Error]:
    """A calendar that names a country needs the optional ``holidays`` package (run by
    ``check --database`` and ``migrate``, since it reads the calendars)."""
    if business_days.holidays_installed():
        return []
    return holidays_errors(databases or [])


def holidays_errors(databases: Sequence[str]) -> list[Error]:
    errors = []
    for alias in databases:
        try:
            names = list(
                Calendar.objects.using(alias)
                .exclude(holidays_country="")
                .values_list("name", flat=True)
            )
        except DatabaseError:
            continue  # not migrated yet: no calendar to check
        errors += [
            Error(
                f"Calendar {name!r} names a country, but {business_days.HOLIDAYS_MISSING}.",
                hint="Install the extra, or clear the calendar's country.",
                id="django_periodic.E008",
            )
            for name in names
        ]
    return errors


@register(Tags.compatibility)
def check_opentelemetry(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error]:
    """``OPENTELEMETRY`` needs opentelemetry-api (the ``opentelemetry`` extra)."""
    return _extra_missing(
        "OPENTELEMETRY", opentelemetry.installed, opentelemetry.MISSING, "opentelemetry", "E012"
    )


def _switched_on(key: str) -> bool:
    """Whether ``DJANGO_PERIODIC[key]`` is True (any other value is check_settings')."""
    configured = getattr(settings, SETTING_NAME, None)
    return isinstance(configured, dict) and configured.get(key) is True


def _extra_missing(
    key: str, installed: Callable[[], bool], missing: str, extra: str, code: str
) -> list[Error]:
    """The error of a switch ``key`` that is on without the optional package it needs."""
    if not _switched_on(key) or installed():
        return []
    return [
        Error(
            f"{SETTING_NAME}['{key}'] is on, but {missing}",
            hint=f"pip install 'django-periodic[{extra}]', or turn {key} off.",
            id=f"django_periodic.{code}",
        )
    ]
