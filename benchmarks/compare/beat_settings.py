"""Minimal Django settings for the django-celery-beat peer: its own database on the
benchmark's PostgreSQL ($BENCH_PG_PORT, $BENCH_DB)."""

import os

SECRET_KEY = "benchmark-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        "USER": "postgres",
        "NAME": os.environ.get("BENCH_DB", "bench_celery_beat"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
