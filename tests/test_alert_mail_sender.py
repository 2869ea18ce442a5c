"""The alert mail leaves the scheduler's loop: a thread of its own gathers the changes of one
ALERT_INTERVAL into one mail, lists a bounded number, says what it could not tell, and
gives up on a mail server that never answers, without holding up the loop or the stop."""

import logging
import os
import socket
import threading
import time
import warnings
from datetime import timedelta

import django
import pytest

from django_periodic.db import clock
from django_periodic.engine.planning import attention
from django_periodic.engine.runs import deadlines
from django_periodic.models import Schedule
from django_periodic.operations import alert_mail
from tests import legacy_mail
from tests.factories import RunFactory, ScheduleFactory
from tests.models import Execution
from tests.processes import ROOT, wait_for

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)
pytestmark = legacy_mail.WARNINGS
ADMINS = [("Ops", "ops@example.com")]
SMTP = "django.core.mail.backends.smtp.EmailBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"


class SilentMailServer:
    """A mail server on loopback that accepts connections and never says a word."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections.append(connection)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        for connection in [self._listener, *self.connections]:
            connection.close()


@pytest.fixture
def silent_mail_server():
    server = SilentMailServer()
    yield server
    server.close()


@pytest.fixture
def outbox(monkeypatch):
    """The receiver's outbox, new: no mail sent earlier holds this test's first one back."""
    from django_periodic.operations.alert_outbox import Outbox

    fresh = Outbox(alert_mail.send, alert_mail.interval_seconds)
    monkeypatch.setattr(alert_mail, "outbox", fresh)
    yield fresh
    fresh.flush(timeout=30)


@pytest.fixture
def mailing(settings):
    settings.ADMINS = ADMINS
    settings.DJANGO_PERIODIC = {"ALERT_MAIL_ADMINS": True, "ALERT_INTERVAL": HOUR}


def failing(*names: str) -> list[Schedule]:
    """Schedules that need attention at the next evaluation: one run, failed."""
    schedules = [ScheduleFactory(name=name, alert_failures=1) for name in names]
    for schedule in schedules:
        RunFactory(schedule=schedule, plan_time=clock.now() - HOUR, status="failed")
    return schedules


# -- gathering -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_changes_of_one_evaluation_are_one_mail(mailing, outbox, mailoutbox):
    failing("billing", "digest", "nightly")
    assert len(attention.evaluate(clock.now()).changes) == 3
    assert outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert mail.subject.endswith("3 schedule(s) need attention")
    assert mail.to == ["ops@example.com"]
    lines = mail.body.splitlines()
    assert len(lines) == 3
    for name, line in zip(("billing", "digest", "nightly"), sorted(lines), strict=True):
        assert line.startswith(f"Schedule {name!r} needs attention since ")
        assert line.endswith(": its last 1 run(s) failed.")


@pytest.mark.django_db(transaction=True)
def test_a_flapping_schedule_is_mailed_once_an_alert_interval(mailing, outbox, mailoutbox):
    (flaky,) = failing("flaky")
    attention.evaluate(clock.now())
    # The first change after a quiet spell goes at once (GATHER after it).
    wait_for(lambda: mailoutbox, 30, "the first mail")
    RunFactory(schedule=flaky, plan_time=clock.now() - SECOND, status="succeeded")
    (recovered,) = attention.evaluate(clock.now()).changes
    assert recovered.ended
    # Held for the rest of the ALERT_INTERVAL (an hour): only a flush sends it now.
    assert len(mailoutbox) == 1
    assert outbox.flush(timeout=30)
    first, second = mailoutbox
    assert first.subject.endswith("Schedule 'flaky' needs attention: its last 1 run(s) failed")
    assert second.subject.endswith("Schedule 'flaky' recovered")


# -- the cap ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_storm_is_one_mail_listing_the_first_changes_and_counting_the_rest(
    mailing, outbox, mailoutbox, caplog
):
    from django_periodic.operations.alert_outbox import SIZE

    failing(*(f"schedule-{n:03}" for n in range(SIZE + 50)))
    assert len(attention.evaluate(clock.now()).changes) == SIZE + 50
    assert outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert mail.subject.endswith(f"{SIZE} schedule(s) need attention")
    listed = [line for line in mail.body.splitlines() if line.startswith("Schedule ")]
    assert len(listed) == SIZE
    assert f"50 more change(s) are not listed: one mail lists {SIZE} at most." in mail.body
    assert "`manage.py periodic_status` lists every schedule that needs attention." in mail.body
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    full = f"The next alert mail already lists {SIZE} changes: more are counted, not listed."
    counted = (
        f"Mailed {SIZE} change(s) of schedules' need for attention; 50 more not listed, and 0 "
        "earlier not mailed, were counted in the mail."
    )
    assert full in warnings
    assert counted in warnings


# -- a mail server that fails ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_silent_mail_server_times_out_and_the_next_mail_says_so(
    mailing, outbox, mailoutbox, settings, silent_mail_server, caplog
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent_mail_server.port
    settings.EMAIL_TIMEOUT = 0.5
    failing("billing", "digest")
    attention.evaluate(clock.now())
    assert outbox.flush(timeout=30)  # given up after EMAIL_TIMEOUT, not waiting forever
    assert silent_mail_server.connections
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    failed = "Could not mail 2 change(s) of schedules' need for attention; the next mail says so."
    assert failed in errors
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    failing("nightly")
    attention.evaluate(clock.now())
    assert outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert mail.subject.endswith("Schedule 'nightly' needs attention: its last 1 run(s) failed")
    assert "2 earlier change(s) were not mailed: the mail server failed" in mail.body


def test_the_mail_server_gets_django_s_timeout_else_ours(settings):
    settings.EMAIL_TIMEOUT = None  # Django's default: wait forever
    assert alert_mail.timeout() == alert_mail.DEFAULT_TIMEOUT == 10
    settings.EMAIL_TIMEOUT = 3
    assert alert_mail.timeout() == 3


@pytest.mark.skipif(django.VERSION < (6, 1), reason="MAILERS are Django 6.1's")
@pytest.mark.django_db(transaction=True)
def test_with_mailers_the_default_mailer_sends_and_no_deprecated_email_api_is_used(
    mailing, outbox, mailoutbox, settings, silent_mail_server, caplog
):
    settings.ADMINS = [address for _, address in ADMINS]  # MAILERS' form: addresses
    options = {"host": "127.0.0.1", "port": silent_mail_server.port, "timeout": 0.5}
    settings.MAILERS = {"default": {"BACKEND": SMTP, "OPTIONS": options}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failing("billing")
        attention.evaluate(clock.now())
        assert outbox.flush(timeout=30)  # given up after the mailer's timeout
        assert silent_mail_server.connections  # the mailer's host and port, no EMAIL_*
        settings.MAILERS = {"default": {"BACKEND": LOCMEM}}
        failing("nightly")
        attention.evaluate(clock.now())
        assert outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert mail.to == ["ops@example.com"]
    assert mail.subject.endswith("Schedule 'nightly' needs attention: its last 1 run(s) failed")
    assert "1 earlier change(s) were not mailed: the mail server failed" in mail.body
    ours = [str(w.message) for w in caught if "django_periodic" in w.filename]
    assert not ours, ours


# -- a real scheduler ------------------------------------------------------------------------

HEALTHY = 20
# Seconds of fires counted after the mail server stopped answering, and the share of them
# that must have run (generous: a loaded machine runs late, a held-up loop runs none).
WATCHED, KEPT = 5, 0.5
GRACE = 10  # the child's SHUTDOWN_GRACE, in seconds


@pytest.mark.django_db(transaction=True)
def test_a_silent_mail_server_holds_up_neither_the_schedules_nor_the_stop(
    postgres, children, silent_mail_server, tmp_path
):
    # The project's settings, with the ADMINS mailed through the silent server (and
    # Django's EMAIL_TIMEOUT left unset: wait forever).
    (tmp_path / "mail_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        f"ADMINS = {ADMINS!r}\n"
        'EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"\n'
        f'EMAIL_HOST, EMAIL_PORT = "127.0.0.1", {silent_mail_server.port}\n'
    )
    for n in range(HEALTHY):
        ScheduleFactory(name=f"healthy-{n:02}", job="tests.jobs.record", interval=SECOND)
    ScheduleFactory(name="broken", job="tests.jobs.explode", interval=SECOND, alert_failures=1)
    child = children.start(
        settings={"ALERT_MAIL_ADMINS": True, "ALERT_INTERVAL": 1, "SHUTDOWN_GRACE": GRACE},
        env={
            "DJANGO_SETTINGS_MODULE": "mail_settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        },
    )
    wait_for(lambda: silent_mail_server.connections, 60, "the alert mail to reach the server")
    silent_since = clock.now()
    watched_until = silent_since + WATCHED * SECOND
    later = Execution.objects.filter(plan_time__gte=watched_until)
    wait_for(
        lambda: later.values("schedule").distinct().count() == HEALTHY,
        60,
        f"every healthy schedule to run {WATCHED} s after the mail server went silent",
    )
    ran = Execution.objects.filter(plan_time__gte=silent_since, plan_time__lt=watched_until)
    assert ran.count() >= KEPT * HEALTHY * WATCHED
    stopping = time.monotonic()
    assert child.terminate(timeout=60) == 0
    stopped_in = time.monotonic() - stopping
    assert stopped_in < GRACE, child.output()
    print(f"{ran.count()} of {HEALTHY * WATCHED} fires ran; stopped in {stopped_in:.1f} s")


@pytest.mark.django_db(transaction=True)
def test_a_late_run_is_mailed_with_its_deadline(mailing, outbox, mailoutbox):
    schedule = ScheduleFactory(name="export", finish_within=timedelta(minutes=10))
    now = clock.now()
    RunFactory(
        schedule=schedule, plan_time=now - HOUR, finish_by=now - HOUR + timedelta(minutes=10)
    )
    assert len(deadlines.flag_late(now)) == 1
    assert len(attention.evaluate(now).changes) == 1
    assert outbox.flush(timeout=30)
    (mail,) = mailoutbox
    assert mail.subject.endswith(
        "Schedule 'export' needs attention: "
        "a run was not finished within 10 minutes of its plan time"
    )
