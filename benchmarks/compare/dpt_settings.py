"""Minimal Django settings for the django-periodic-tasks peer: its own database on the
benchmark's PostgreSQL ($BENCH_PG_PORT, $BENCH_DB); tasks go to django-tasks' in-memory
DummyBackend, the counterpart of Celery's memory broker."""

import os

SECRET_KEY = "benchmark-only"
USE_TZ = True
TIME_ZONE = "UTC"
# The admin too: django-periodic-tasks' model checks walk every loaded module, the admin's
# lazy default site among them, which needs the admin app installed.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_tasks",
    "django_periodic_tasks",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
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
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        "USER": "postgres",
        "NAME": os.environ.get("BENCH_DB", "bench_dpt"),
    }
}
TASKS = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
# Only instrumented (events logged); the scheduling code is the package's own.
PERIODIC_TASKS_SCHEDULER_CLASS = "dpt_instrumented.InstrumentedScheduler"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
