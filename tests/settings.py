"""Settings for the test suite: SQLite or PostgreSQL, chosen by PERIODIC_TEST_DB.

PERIODIC_TEST_DB=sqlite (default) or postgres (with PERIODIC_TEST_POSTGRES_URL, and
PERIODIC_TEST_PGBOUNCER_URL to go through PgBouncer).
Child processes started by tests (real run_scheduler processes) get PERIODIC_TEST_DB_NAME,
the name of the test database the parent created, so they use the same data.
"""

import copy
import json
import os
import tempfile
from importlib.util import find_spec
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
# Each admin test creates a user; the default hasher's 1,000,000+ rounds would cost it half a
# second. No test is about password strength.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_periodic",
    "django_tasks_db",
    "tests",
]
# The django-health-check integration's tests, and import_celery_beat's, which reads
# django-celery-beat's own tables: both packages are in the test group, so required.
INSTALLED_APPS += ["health_check", "django_celery_beat"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ENGINE = os.environ.get("PERIODIC_TEST_DB", "sqlite")
CHILD_DB_NAME = os.environ.get("PERIODIC_TEST_DB_NAME")

if ENGINE == "postgres":
    url = os.environ.get(
        "PERIODIC_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/periodic"
    )
    default = environ.Env.db_url_config(url)
    # test_<the URL's database>: two test runs with different URLs on one server do not
    # share their test database.
    default["TEST"] = {"NAME": f"test_{default['NAME']}"}
elif ENGINE == "sqlite":
    # A file, not :memory:, so worker threads and child processes share the test database;
    # one per pytest process, so that two test runs on one machine do not share it.
    path = Path(tempfile.gettempdir()) / f"periodic-tests-{os.getpid()}.sqlite3"
    default = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "TEST": {"NAME": str(path)},
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
else:
    raise RuntimeError(f"PERIODIC_TEST_DB must be sqlite or postgres, not {ENGINE!r}")

DATABASES = {"default": default}
DJANGO_PERIODIC: dict[str, object] = {"POLL_INTERVAL": 1}

# PERIODIC_TEST_PGBOUNCER_URL: "default" goes through PgBouncer in transaction mode (marked as
# Django requires), and "direct", to the same database, serves the schedulers' wake-ups.
PGBOUNCER_URL = os.environ.get("PERIODIC_TEST_PGBOUNCER_URL")
if ENGINE == "postgres" and PGBOUNCER_URL:
    DATABASES["direct"] = {**copy.deepcopy(default), "TEST": {"MIRROR": "default"}}
    default = DATABASES["default"] = environ.Env.db_url_config(PGBOUNCER_URL)
    # Its own name: PgBouncer keeps server connections to it, which would stop another
    # run from dropping it (the PgBouncer run keeps it, --reuse-db).
    default["TEST"] = {"NAME": f"test_{default['NAME']}_pgbouncer"}
    default["DISABLE_SERVER_SIDE_CURSORS"] = True
    DJANGO_PERIODIC["WAKEUP_DATABASE"] = "direct"

if CHILD_DB_NAME:
    for config in DATABASES.values():
        config["NAME"] = CHILD_DB_NAME
        if ENGINE == "postgres":
            # So the parent waits for its children's sessions only (tests.processes); those
            # PgBouncer keeps in its pool after a child exits are named apart.
            pooled = config.get("DISABLE_SERVER_SIDE_CURSORS")
            name = "periodic-test-child-pooled" if pooled else "periodic-test-child"
            config.setdefault("OPTIONS", {})["application_name"] = name
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_periodic": {"handlers": ["console"], "level": "INFO"},
        # The run log (a line per run transition) only where a test turns it on.
        "django_periodic.runs": {"level": "WARNING"},
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's tasks framework: built in on Django 6, the django-tasks backport on 5.2. Tests
# hand runs to these backends by alias; django-tasks-db's is executed by db_worker processes.
if find_spec("django.tasks"):
    TASKS_BACKENDS = "django.tasks.backends"
else:
    TASKS_BACKENDS = "django_tasks.backends"
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_tasks_db"), "django_tasks")
TASKS: dict[str, dict[str, object]] = {
    "default": {"BACKEND": f"{TASKS_BACKENDS}.immediate.ImmediateBackend"},
    "dummy": {"BACKEND": f"{TASKS_BACKENDS}.dummy.DummyBackend"},
    "database": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}

# PERIODIC_TEST_REDIS_URL: "celery", a backend whose tasks Celery workers execute
# (django-tasks-fennel), with Redis as broker and result backend.
REDIS_URL = os.environ.get("PERIODIC_TEST_REDIS_URL")
if REDIS_URL and find_spec("django_tasks_fennel"):
    INSTALLED_APPS.append("django_tasks_fennel")
    TASKS["celery"] = {"BACKEND": "django_tasks_fennel.CeleryBackend", "QUEUES": ["default"]}
    CELERY_BROKER_URL = CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_RESULT_EXTENDED = True
    # A killed worker strands the tasks it reserved and had not started: reserve only one.
    CELERY_WORKER_PREFETCH_MULTIPLIER = 1
    # Celery closes every database connection before and after each task unless told to
    # reuse them: a new PostgreSQL backend per run otherwise.
    CELERY_DB_REUSE_MAX = 1000

# PERIODIC_TEST_SENTRY_FILE: a child process initialises sentry-sdk with a transport that
# appends the check-ins it would send to this file (tests/test_sentry_crons.py).
if SENTRY_FILE := os.environ.get("PERIODIC_TEST_SENTRY_FILE"):
    from tests import sentry_transport

    sentry_transport.start(sentry_transport.CapturingTransport(SENTRY_FILE))

# Child processes may be given extra DJANGO_PERIODIC keys as JSON (e.g. a short grace).
DJANGO_PERIODIC.update(json.loads(os.environ.get("PERIODIC_TEST_SETTINGS", "{}")))
# ...and a file their OpenTelemetry spans are written to (tests/spans.py).
if os.environ.get("PERIODIC_TEST_SPANS_FILE"):
    from tests import spans

    spans.export_to(os.environ["PERIODIC_TEST_SPANS_FILE"])
if ENGINE == "postgres":
    # Workers reuse their connection between runs, as a production scheduler should.
    DATABASES["default"].update(CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True)
# A child process may be given Django's default (0) instead, to measure as users run it.
if "PERIODIC_TEST_CONN_MAX_AGE" in os.environ:
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["PERIODIC_TEST_CONN_MAX_AGE"])
