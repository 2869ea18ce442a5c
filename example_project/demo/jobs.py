"""Example jobs. django_periodic imports every installed app's ``jobs.py`` at startup.

Jobs decorated with a trigger (``cron=``, ``interval=`` or ``run_at=``) get a schedule of
the same name, which ``run_scheduler`` creates or updates in the database when it starts.
A plain ``@job`` has no schedule of its own: create one in the admin (Periodic jobs ->
Schedules -> Add) or with the ORM.
"""

import logging
import random
import time
from datetime import timedelta

from django.contrib.sessions.models import Session
from django.utils import timezone

from django_periodic import job

logger = logging.getLogger("demo")


@job(cron="* * * * *")
def tidy_sessions():
    """Delete expired sessions, every minute; returns how many were deleted."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return {"deleted": deleted}


@job(interval=timedelta(seconds=30), max_attempts=3, retry_backoff=timedelta(seconds=3))
def flaky_sync():
    """Pretend to call a flaky API every 30 seconds; fails about one time in three.

    A failed attempt is retried after about 3 seconds, then about 6, up to 3 attempts;
    see the Runs list in the admin for the retrying and failed runs and their errors.
    """
    if random.random() < 1 / 3:
        raise ConnectionError("the upstream API did not answer (a simulated failure)")
    return {"synced": random.randint(1, 100)}


@job(cron="*/2 * * * *", timezone="Europe/Berlin", takes_context=True)
def slow_report(context, seconds: int = 8):
    """Build a slow report every two minutes (Berlin time), heartbeating as it goes."""
    done = 0
    for _ in range(seconds):
        if context.cancelled:  # the lease was lost or the scheduler is shutting down
            logger.info("slow_report for %s stopped early after %d s", context.plan_time, done)
            return {"steps": done, "stopped_early": True}
        time.sleep(1)
        done += 1
        context.heartbeat()  # extends this run's lease; returns False if it was lost
    return {"steps": done, "plan_time": context.plan_time.isoformat(), "attempt": context.attempt}


@job
def greet(name: str, punctuation: str = "!"):
    """Say hello to someone; schedule it from the admin with args ["World"]."""
    message = f"Hello, {name}{punctuation}"
    logger.info(message)
    return message


@job
def export_to_partner(partner: str = "acme"):
    """Upload an export to a partner's server, which is down: always fails.

    Run it from the admin to see a failed run: its error, traceback and lease.
    """
    rows = [{"id": i, "partner": partner} for i in range(3)]
    _upload(partner, rows)


def _upload(partner: str, rows: list) -> None:
    raise ConnectionRefusedError(f"sftp://{partner}.example.com refused the connection")
