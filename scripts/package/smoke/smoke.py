"""Smoke test of an installed django-periodic (a wheel or an sdist), from a throwaway project.

scripts/lib/package.sh copies this directory into a temporary one and runs this file with the
Python of a fresh virtualenv that has only the artefact (and its dependencies) installed:

    python smoke.py

It checks that the installed package, not a checkout, is imported; that its migrations apply
and match its models; that `check` finds nothing; that a job from an app's jobs.py runs through
`run_scheduler --once` in a process of its own; and that the admin renders the package's
templates and finds its static files. Each step prints one line; the first failure raises.
"""

import os
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()  # the venv's site-packages
os.environ["DJANGO_SETTINGS_MODULE"] = "smoke_settings"
os.environ["PYTHONPATH"] = str(HERE)  # for the manage commands run as processes


def step(message: str) -> None:
    print(f"  smoke: {message}", flush=True)


def manage(*args: str) -> None:
    """A management command in a process of its own, as a deployment would run it; its output
    is shown only if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        print(done.stdout + done.stderr, end="", file=sys.stderr)
        raise AssertionError(f"manage.py {' '.join(args)} exited with {done.returncode}")


def check_installed() -> None:
    import django

    import django_periodic

    where = Path(django_periodic.__file__).resolve().parent
    if not where.is_relative_to(SITE):
        raise AssertionError(f"django_periodic imported from {where}, not from {SITE}")
    step(
        f"django-periodic {version('django-periodic')} imported from {where}"
        f" (Python {sys.version.split()[0]}, Django {django.get_version()})"
    )


def check_setup() -> None:
    manage("migrate", "--noinput", "-v", "0")
    # Shipped migrations that lag behind the shipped models would surface only in users'
    # makemigrations; a migration missing from the artefact would fail migrate above.
    manage("makemigrations", "--check", "--dry-run", "-v", "0", "django_periodic")
    manage("check", "--fail-level", "WARNING")
    step("migrate, makemigrations --check and check --fail-level WARNING passed")


def check_run() -> int:
    """A manual run of smoke_app.jobs.echo, executed by `run_scheduler --once`; its id."""
    from django.db import connections

    from django_periodic.models import Run, Schedule
    from django_periodic.registry import registered_jobs

    if "smoke_app.jobs.echo" not in registered_jobs():
        raise AssertionError(f"smoke_app.jobs.echo not registered: {sorted(registered_jobs())}")
    schedule = Schedule(name="smoke", job="smoke_app.jobs.echo", args=["hello"], cron="0 3 * * *")
    schedule.full_clean()
    schedule.save()
    run = schedule.run_now()
    connections.close_all()  # SQLite: leave the file to the scheduler process
    manage("run_scheduler", "--once", "-v", "0")
    run.refresh_from_db()
    if run.status != Run.Status.SUCCEEDED:
        raise AssertionError(
            f"run {run.pk} ended {run.status}: {run.error_code} {run.error_message}\n"
            f"{run.traceback}"
        )
    if run.result != {"echo": "hello"}:
        raise AssertionError(f"run {run.pk} succeeded with an unexpected result: {run.result!r}")
    step(f"run_scheduler --once ran the job: run {run.pk} {run.status}, result {run.result}")
    return run.pk


def check_admin(run_id: int) -> None:
    from django.contrib.auth.models import User
    from django.contrib.staticfiles import finders
    from django.template.loader import get_template
    from django.test import Client

    from django_periodic.models import Schedule

    for name in ("django_periodic/admin.css", "django_periodic/schedule_form.js"):
        if not finders.find(name):
            raise AssertionError(f"static file {name} not found in the installed package")
    get_template("django_periodic/admin/preview.html")

    client = Client()
    client.force_login(User.objects.create_superuser("smoke", "smoke@example.com", "smoke"))
    schedule = Schedule.objects.get(name="smoke")
    pages = {
        "/admin/django_periodic/schedule/add/": "django_periodic/schedule_form.js",
        f"/admin/django_periodic/schedule/{schedule.pk}/change/": "smoke_app.jobs.echo",
        f"/admin/django_periodic/run/{run_id}/change/": "django_periodic/admin.css",
        "/admin/django_periodic/run/": "smoke",
    }
    for url, expected in pages.items():
        response = client.get(url)
        if response.status_code != 200:
            raise AssertionError(f"GET {url}: {response.status_code}")
        if expected not in response.content.decode():
            raise AssertionError(f"GET {url}: {expected!r} not in the page")
    templates = [
        "admin/django_periodic/schedule/change_form.html",
        "admin/django_periodic/run/change_form.html",
    ]
    for name in templates:
        origin = get_template(name).origin.name
        if not Path(origin).resolve().is_relative_to(SITE):
            raise AssertionError(f"template {name} loaded from {origin}")
    step(f"admin pages rendered ({len(pages)}), templates and static files found")


def main() -> None:
    import django

    django.setup()
    check_installed()
    check_setup()
    run_id = check_run()
    check_admin(run_id)
    step("OK")


if __name__ == "__main__":
    main()
