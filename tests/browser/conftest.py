"""Browser tests: headless Chromium (Debian's) driven by Playwright against the example project.

The example project is served as a user runs it: ``manage.py runserver`` and ``manage.py
run_scheduler`` in their own processes, on a fresh SQLite file, so a run requested in the
browser is really executed. ``PERIODIC_CHROMIUM`` names the browser (``bash scripts/test.sh``
installs it and sets it); without it these tests skip and say why. ``PERIODIC_SCREENSHOTS``
names a folder for the screenshots the docs use (``docs/images``); by default they go to a
temporary folder, so a test run never changes the working tree.
"""

import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "example_project" / "manage.py"
START_TIMEOUT = 60  # seconds for migrate, the server's system checks and its bind
VIEWPORT = {"width": 1600, "height": 1000}

# An operator, a view-only user and one who may also delete schedules; a schedule whose job
# always fails, run once; a day of history for the list to show; and a schedule whose job is
# gone, which the scheduler reports (last_error) at its next tick.
SETUP = """
from datetime import timedelta
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from django_periodic.models import Run, Schedule

User.objects.create_superuser("admin", "admin@example.com", "admin")
viewer = User.objects.create_user("viewer", password="viewer", is_staff=True)
viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
deleter = User.objects.create_user("deleter", password="deleter", is_staff=True)
deleter.user_permissions.add(
    *Permission.objects.filter(codename__in=["view_schedule", "delete_schedule"])
)

def schedule(**fields):
    created = Schedule(**fields)
    created.full_clean()
    created.save()
    return created

export = schedule(name="export to partner", job="demo.jobs.export_to_partner",
                  cron="0 6 * * *", timezone="America/New_York")
export.run_now()

sync = schedule(name="hourly sync", job="demo.jobs.greet", args=["sync"], cron="0 * * * *")
hour = timezone.now().replace(minute=0, second=0, microsecond=0)
outcomes = {5: ("failed", "ConnectionError"), 11: ("skipped", "overlap")}
Run.objects.bulk_create(
    Run(schedule=sync, plan_time=hour - timedelta(hours=h), job_name=sync.job, args=sync.args,
        status=outcomes.get(h, ("succeeded", ""))[0], error_code=outcomes.get(h, ("", ""))[1],
        attempt=1, started_at=hour - timedelta(hours=h, seconds=-1),
        duration=timedelta(milliseconds=40 + h))
    for h in range(1, 25)
)

orders = schedule(name="import orders", job="demo.jobs.greet", args=["orders"], cron="*/10 * * * *")
# A job removed from the code a day ago: no process has had it for longer than
# UNKNOWN_JOB_GRACE, so the first planning pass disables the schedule and says why.
Schedule.objects.filter(pk=orders.pk).update(
    job="demo.jobs.import_orders", next_fire_at=hour, job_unknown_since=hour - timedelta(days=1)
)
"""


@dataclass
class ExampleSite:
    """The example project's server and scheduler, and where their output goes."""

    url: str
    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def shell(self, code: str) -> None:
        """Run Python in the example project (``manage.py shell``), e.g. to add rows."""
        _manage(_environment(self.workdir), self.workdir, "shell", "--command", code)

    def logs(self) -> str:
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-40:]
            parts.append(f"--- {log.name} (last lines) ---\n" + "\n".join(lines))
        return "\n".join(parts)


_sites: list[ExampleSite] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for site in _sites:
            report.sections.append(("example project logs", site.logs()))
    return report


def _environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",  # pytest set tests.settings
        DATABASE_URL=f"sqlite:///{workdir / 'example.sqlite3'}",
        PYTHONUNBUFFERED="1",
        DJANGO_RUNSERVER_HIDE_WARNING="true",
        # The package of this checkout, even where the virtualenv installed another one
        # (a second work tree sharing the first's virtualenv), as tests.processes does.
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return env


def _manage(env: dict[str, str], workdir: Path, *args: str) -> None:
    with open(workdir / "setup.log", "a") as log:
        subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=START_TIMEOUT,
        )


def _serve(env: dict[str, str], workdir: Path) -> tuple[subprocess.Popen, str]:
    """Start runserver on a free port; return it once it listens, with its URL."""
    with open(workdir / "server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, str(MANAGE), "runserver", "--noreload", "127.0.0.1:0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,  # the child keeps its own copy of the file
            text=True,
        )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        # The server prints its address after binding; later output is kept in a log.
        with open(workdir / "server-stdout.log", "w") as log:
            for line in server.stdout:
                lines.put(line)
                log.write(line)
                log.flush()
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            server.kill()
            raise RuntimeError("the example server did not start in time") from None
        if not line:
            log = (workdir / "server.log").read_text()
            raise RuntimeError(f"the example server exited:\n{log}")
        # "Starting development server at URL" (Django 6.1: "... WSGI development server ...")
        started = re.match(r"Starting .*server at (\S+)", line)
        if started:
            return server, started.group(1)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()  # run_scheduler stops gracefully on SIGTERM
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary, or a skip that says how to get one."""
    reason = os.environ.get("PERIODIC_BROWSER_SKIP")
    if reason:
        pytest.skip(reason)
    path = os.environ.get("PERIODIC_CHROMIUM", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(
            "browser tests need Chromium: set PERIODIC_CHROMIUM=/usr/bin/chromium "
            "(bash scripts/test.sh installs Debian's chromium and sets it)"
        )
    return path


@pytest.fixture(scope="session")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def example_site(chromium, tmp_path_factory) -> Iterator[ExampleSite]:
    """The example project on a new SQLite file: a server and a scheduler, both real."""
    workdir = tmp_path_factory.mktemp("example-site")
    env = _environment(workdir)
    _manage(env, workdir, "migrate", "--noinput")
    _manage(env, workdir, "shell", "--command", SETUP)
    server, url = _serve(env, workdir)
    site = ExampleSite(url=url.rstrip("/"), workdir=workdir, processes=[server])
    with open(workdir / "scheduler.log", "w") as log:
        site.processes.append(
            subprocess.Popen(
                [sys.executable, str(MANAGE), "run_scheduler"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    _sites.append(site)
    yield site
    _sites.remove(site)
    for process in reversed(site.processes):
        _stop(process)


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where screenshots go: PERIODIC_SCREENSHOTS (e.g. docs/images), else a temporary folder."""
    folder = os.environ.get("PERIODIC_SCREENSHOTS")
    path = (ROOT / folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _logged_in(browser, site: ExampleSite, username: str, password: str):
    context = browser.new_context(viewport=VIEWPORT, base_url=site.url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto("/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    return context, page


@pytest.fixture
def admin_page(browser, example_site):
    context, page = _logged_in(browser, example_site, "admin", "admin")
    yield page
    context.close()


@pytest.fixture
def viewer_page(browser, example_site):
    context, page = _logged_in(browser, example_site, "viewer", "viewer")
    yield page
    context.close()


@pytest.fixture
def deleter_page(browser, example_site):
    """A staff user who may view and delete schedules, and nothing else."""
    context, page = _logged_in(browser, example_site, "deleter", "deleter")
    yield page
    context.close()
