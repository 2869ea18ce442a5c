"""Settings for the django_periodic example project.

Every value can be overridden by an environment variable or by a ``.env`` file next to
manage.py, e.g.::

    DATABASE_URL=postgres://user:password@127.0.0.1:5432/periodic
    TIME_ZONE=Europe/Berlin
"""

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # optional: a missing file is fine

SECRET_KEY = env("SECRET_KEY", default="django-insecure-example-project-only")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_periodic",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# Drop a connection that went away (database restart) instead of failing the next query.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the scheduler are two processes writing to one file. Take the
    # write lock when a transaction begins (IMMEDIATE), wait for it instead of failing
    # with "database is locked", and let readers work while a writer writes (WAL).
    sqlite_options = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    if django.VERSION >= (5, 1):
        sqlite_options["transaction_mode"] = "IMMEDIATE"
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        **sqlite_options,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []  # a local demo: the admin user is admin / admin

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

DJANGO_PERIODIC = {
    "WORKERS": 4,
    "POLL_INTERVAL": 2,  # seconds; a run requested in the admin starts within this
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        "django_periodic": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "demo": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
