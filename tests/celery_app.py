"""A Celery app with a beat schedule, as projects define one in ``proj/celery.py``, for
``import_celery_beat --app tests.celery_app:app``."""

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule

app = Celery("tests")
app.conf.timezone = "Europe/Berlin"
app.conf.beat_schedule = {
    "add-every-30-seconds": {"task": "tests.jobs.add", "schedule": 30.0, "args": (16, 16)},
    "nightly-report": {
        "task": "tests.jobs.noop",
        "schedule": crontab(hour=7, minute=30, day_of_week=1),
        "kwargs": {"to": "ops@example.com"},
        "options": {"expires": 3600, "queue": "reports"},
    },
    "every-five-minutes": {"task": "tests.jobs.noop", "schedule": timedelta(minutes=5)},
    "every-minute": {"task": "tests.jobs.noop", "schedule": schedule(run_every=60)},
}
