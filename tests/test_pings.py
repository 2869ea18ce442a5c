"""Ping monitors (operations/pings.py): each schedule's ping URL told, healthchecks.io style,
when its runs start and end, by a sender thread, against real HTTP servers on loopback:
one that records what it received, one that hangs, a port where nothing listens.

The runs are executed for real (``run_due``, committing: transactional database); the
servers' records are the oracle: the path, the ``rid`` pairing, the body.
"""

import logging
import socket
import threading
import urllib.error
import urllib.request
import weakref
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_periodic import signals
from django_periodic.engine.runs import claims, leases
from django_periodic.models import Run, Schedule
from django_periodic.operations import ping_transport, pings
from django_periodic.testing import run_due
from tests.factories import RunFactory, ScheduleFactory
from tests.ping_servers import HangingServer, RecordingServer, refused_url
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "/ping/0b6f8f1e-5d5e-4a37-b0b4-3c1e6d1f2a9c"  # the secret part, as healthchecks.io's


@pytest.fixture
def server():
    recording = RecordingServer()
    yield recording
    recording.close()


@pytest.fixture
def pinger():
    """The receivers connected, as ``PINGS = True`` does, for this test only."""
    connected = pings.Pinger(timedelta(seconds=1))
    connected.connect()
    yield connected
    connected.disconnect()
    connected.flush(10)


def sent(pinger: pings.Pinger) -> None:
    assert pinger.flush(10), "the pings were not sent in time"


def test_a_run_that_succeeds_pings_start_then_success_with_one_rid_and_its_outcome(server, pinger):
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=server.url(KEY))
    (run,) = run_due(now=schedule.next_fire_at)
    start, success = server.wait_for(2)
    assert (start.method, start.path, success.path) == ("POST", f"{KEY}/start", KEY)
    assert start.query["rid"] == success.query["rid"]  # an attempt's start and end pair up
    outcome = success.outcome
    assert outcome["run_id"] == run.pk
    assert outcome["schedule"] == schedule.name
    assert (outcome["status"], outcome["error_code"], outcome["attempt"]) == ("succeeded", "", 1)
    assert outcome["duration"] == Run.objects.get(pk=run.pk).duration.total_seconds()
    assert outcome["plan_time"] == run.plan_time.isoformat()
    assert start.outcome["status"] == "running"


def test_a_run_that_fails_pings_fail_with_its_error_code(server, pinger):
    schedule = ScheduleFactory(job="tests.jobs.explode", ping_url=server.url(KEY))
    run_due(now=schedule.next_fire_at)
    start, failure = server.wait_for(2)
    assert failure.path == f"{KEY}/fail"
    assert failure.query["rid"] == start.query["rid"]
    assert (failure.outcome["status"], failure.outcome["error_code"]) == ("failed", "RuntimeError")


def test_each_attempt_of_a_retried_run_has_its_own_rid_and_a_failed_one_pings_fail(server, pinger):
    schedule = ScheduleFactory(job="tests.jobs.explode", max_attempts=2, ping_url=server.url(KEY))
    (first,) = run_due(now=schedule.next_fire_at)
    run_due(now=first.next_retry_at)
    received = server.wait_for(4)
    assert [r.path for r in received] == [f"{KEY}/start", f"{KEY}/fail"] * 2
    assert [r.outcome["status"] for r in received] == ["running", "retrying", "running", "failed"]
    rids = [r.query["rid"] for r in received]
    assert rids[0] == rids[1] != rids[2] == rids[3]


def test_a_cancelled_run_pings_fail(server, pinger):
    # As the recorder announces a running run that stopped when asked to (outcomes.py).
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=server.url(KEY))
    run = schedule.run_now()
    cancelled = {"status": Run.Status.CANCELLED, "reason": "cancelled", "attempt": 1}
    signals.send([signals.of_run(signals.run_finished, run, duration=None, **cancelled)])
    (failure,) = server.wait_for(1)
    assert failure.path == f"{KEY}/fail"
    assert failure.outcome["status"] == Run.Status.CANCELLED


@pytest.mark.parametrize("reentered", [False, True])
def test_an_attempt_whose_process_died_pings_fail_once(server, pinger, process, now, reentered):
    schedule = ScheduleFactory(
        lease_timeout=timedelta(seconds=5),
        allow_stale_reentry=reentered,
        ping_url=server.url(KEY),
    )
    RunFactory(schedule=schedule, plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    leases.mark_started([claim.token])  # its job was called
    leases.sweep(now + timedelta(seconds=6))
    sent(pinger)
    start, failure = server.received
    assert (start.path, failure.path) == (f"{KEY}/start", f"{KEY}/fail")
    assert failure.query["rid"] == start.query["rid"]
    assert failure.outcome["error_code"] == "lease_expired"
    assert failure.outcome["status"] == ("pending" if reentered else "failed")


def test_a_url_with_a_query_keeps_it_and_a_trailing_slash_is_not_doubled():
    rid = pings.rid(7, 1)
    address = pings.ping_address("https://hc-ping.com/abc/?create=1", pings.START, rid)
    assert address == f"https://hc-ping.com/abc/start?create=1&rid={rid}"
    assert pings.ping_address("https://hc-ping.com/abc", pings.SUCCESS, rid).endswith(
        f"/abc?rid={rid}"
    )
    assert pings.rid(7, 1) != pings.rid(7, 2) != pings.rid(8, 1)


def test_schedules_without_a_ping_url_and_skipped_runs_ping_nothing(server, pinger):
    silent = ScheduleFactory(job="tests.jobs.add", args=[1, 2])
    watched = ScheduleFactory(
        job="tests.jobs.add", args=[1, 2], ping_url=server.url(KEY), interval=timedelta(minutes=1)
    )
    # Two hours down: "latest" runs the last fire and records the others skipped (missed).
    later = watched.next_fire_at + timedelta(hours=2)
    run_due(now=later)
    sent(pinger)
    skipped = Run.objects.filter(schedule=watched, status=Run.Status.SKIPPED).count()
    assert skipped > 0
    assert Run.objects.filter(schedule=silent, status=Run.Status.SUCCEEDED).exists()
    assert [r.path for r in server.received] == [f"{KEY}/start", KEY]


def test_a_batch_of_runs_reads_their_ping_urls_in_one_query(server, pinger):
    schedules = [
        ScheduleFactory(job="tests.jobs.add", args=[n, 1], ping_url=server.url(f"{KEY}-{n}"))
        for n in range(5)
    ]
    released = threading.Event()
    pinger.sender.post(lambda: released.wait(10))  # the sender busy: the pings wait
    for schedule in schedules:
        run = Run.for_schedule(schedule, schedule.next_fire_at, status=Run.Status.SUCCEEDED)
        run.save()
        pinger.note(pings._noted(pings.SUCCESS, signals.of_run(signals.run_finished, run)[1]))
    # The batch sent here, in this thread, to count its queries.
    with CaptureQueriesContext(connections["default"]) as queries:
        pinger.send_waiting()
    released.set()
    assert len(queries) == 1
    assert sorted(r.path for r in server.wait_for(5)) == sorted(f"{KEY}-{n}" for n in range(5))


def test_a_server_that_fails_is_asked_once_and_logged_without_the_url(caplog, pinger):
    failing = RecordingServer(status=500)
    try:
        schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=failing.url(KEY))
        with caplog.at_level(logging.WARNING, logger="django_periodic"):
            run_due(now=schedule.next_fire_at)
            sent(pinger)
        assert [r.path for r in failing.received] == [f"{KEY}/start", KEY]  # no retry
    finally:
        failing.close()
    warnings = [r.getMessage() for r in caplog.records if "failed (not retried)" in r.getMessage()]
    assert len(warnings) == 2
    assert all("HTTP 500" in w and schedule.name in w for w in warnings)
    assert KEY not in caplog.text and str(failing.port) not in caplog.text


def test_a_server_that_is_down_costs_one_attempt_logged_without_the_url(caplog, pinger):
    url = refused_url(KEY)
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=url)
    with caplog.at_level(logging.WARNING, logger="django_periodic"):
        run_due(now=schedule.next_fire_at)
        sent(pinger)
    warnings = [r.getMessage() for r in caplog.records if "failed (not retried)" in r.getMessage()]
    assert len(warnings) == 2  # start and success: one attempt each
    assert all("refused" in w.lower() for w in warnings)
    assert KEY not in caplog.text and url not in caplog.text
    assert Run.objects.get(schedule=schedule).status == Run.Status.SUCCEEDED


def test_a_hanging_server_holds_only_the_sender_and_later_pings_go_out_after_the_timeout(
    server, caplog
):
    hanging = HangingServer()
    pinger = pings.Pinger(timedelta(seconds=0.5))
    pinger.connect()
    try:
        stuck = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=hanging.url(KEY))
        watched = ScheduleFactory(job="tests.jobs.add", args=[2, 2], ping_url=server.url(KEY))
        now = max(stuck.next_fire_at, watched.next_fire_at)
        with caplog.at_level(logging.WARNING, logger="django_periodic"):
            run_due(now=now)
            # The runs go on while the sender waits on the hanging server.
            assert not pinger.flush(0)
            for minutes in range(1, 4):
                run_due(now=now + timedelta(minutes=minutes))
            ran = Run.objects.filter(schedule=stuck, status=Run.Status.SUCCEEDED)
            assert ran.count() == 4
            sent(pinger)
        assert hanging.accepted  # it did hang on it
        assert {r.path for r in server.received} == {f"{KEY}/start", KEY}
        messages = [record.getMessage() for record in caplog.records]
        timeouts = [message for message in messages if "no answer in 0.5 s" in message]
        assert timeouts and all(stuck.name in message for message in timeouts)
        assert KEY not in caplog.text
    finally:
        pinger.disconnect()
        hanging.close()


def test_a_hanging_server_holds_up_its_own_pings_only_not_another_hosts(server):
    """The hanging server holds its ping for the whole timeout (30 s): the other host's
    pings, noted after it, arrive long before that, so they did not wait behind it."""
    hanging = HangingServer()
    pinger = pings.Pinger(timedelta(seconds=30))
    pinger.connect()
    try:
        stuck = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=hanging.url(KEY))
        run_due(now=stuck.next_fire_at)
        wait_for(lambda: hanging.accepted, 10, "the hanging server to be asked")
        watched = ScheduleFactory(job="tests.jobs.add", args=[2, 2], ping_url=server.url(KEY))
        run_due(now=watched.next_fire_at)
        assert [r.path for r in server.wait_for(2, timeout=15)] == [f"{KEY}/start", KEY]
        assert not pinger.flush(0)  # the hanging server still holds its own
    finally:
        pinger.disconnect()
        hanging.close()  # its ping fails at once now
    assert pinger.flush(10)


# -- where pings go: the URL's rule again when sending, no redirect, no local address ------


def test_a_redirect_is_not_followed_and_is_the_pings_failure(caplog, pinger):
    redirecting = RecordingServer(status=302, location="/elsewhere")
    try:
        schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=redirecting.url(KEY))
        with caplog.at_level(logging.WARNING, logger="django_periodic"):
            run_due(now=schedule.next_fire_at)
            sent(pinger)
        # Each ping's own request only: nothing asked at /elsewhere.
        assert [r.path for r in redirecting.received] == [f"{KEY}/start", KEY]
    finally:
        redirecting.close()
    warnings = [r.getMessage() for r in caplog.records if "failed (not retried)" in r.getMessage()]
    assert len(warnings) == 2
    assert all("HTTP 302, a redirect (never followed)" in w for w in warnings)
    assert KEY not in caplog.text and str(redirecting.port) not in caplog.text


def test_a_redirect_to_ftp_is_not_followed(pinger):
    ftp = HangingServer()  # an FTP server would greet; this one records the connections
    redirecting = RecordingServer(status=302, location=f"ftp://127.0.0.1:{ftp.port}/x")
    try:
        schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=redirecting.url(KEY))
        run_due(now=schedule.next_fire_at)
        sent(pinger)
        assert len(redirecting.received) == 2
        assert ftp.connected_before_now() == 0
    finally:
        redirecting.close()
        ftp.close()


def test_ping_hosts_is_checked_again_before_each_ping(server, pinger, settings, caplog):
    # Saved while any host was allowed; the setting changed since.
    schedule = ScheduleFactory(job="tests.jobs.add", args=[1, 2], ping_url=server.url(KEY))
    settings.DJANGO_PERIODIC = {"PING_HOSTS": ["hc-ping.com"]}
    with caplog.at_level(logging.WARNING, logger="django_periodic"):
        run_due(now=schedule.next_fire_at)
        sent(pinger)
    assert server.received == []
    refusals = [r.getMessage() for r in caplog.records if "refused (not sent)" in r.getMessage()]
    assert len(refusals) == 2  # start and success
    assert all("PING_HOSTS" in w and f"(id {schedule.pk})" in w for w in refusals)
    assert KEY not in caplog.text


def test_a_host_that_resolves_to_an_unspecified_address_is_not_connected_to():
    """The URL's rule sees a host's name only; the sender checks each address the name
    resolves to before connecting. 0.0.0.0 reaches this host's own services (here, the
    listener on 127.0.0.1) and stands for any name that resolves to such an address."""
    listener = HangingServer()
    try:
        request = urllib.request.Request(f"http://0.0.0.0:{listener.port}{KEY}", method="POST")
        with pytest.raises(urllib.error.URLError) as refused:
            ping_transport.opener.open(request, timeout=5)
        assert isinstance(refused.value.reason, ping_transport.RefusedAddress)
        assert listener.connected_before_now() == 0
        # Where it would have gone.
        socket.create_connection(("0.0.0.0", listener.port), timeout=5).close()
        assert listener.connected_before_now() == 2  # that one, and the first probe
    finally:
        listener.close()


def everything_logged(records: list[logging.LogRecord]) -> str:
    """Each record as a handler writes it (its traceback included), and every local variable
    of every frame of that traceback, as an error tracker sends them (Sentry does)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    logged = []
    for record in records:
        logged.append(formatter.format(record))
        frame = record.exc_info[2] if record.exc_info else None
        while frame is not None:
            logged += [repr(value) for value in frame.tb_frame.f_locals.values()]
            frame = frame.tb_next
    return "\n".join(logged)


@pytest.mark.parametrize(
    "bad_url",
    [
        f"http://127.0.0.1:70000{KEY}",  # past the last port: urllib raised on it
        f"http://169.254.169.254{KEY}",  # a cloud's metadata service
        "credentials",  # the good server's URL, with a user and password
    ],
)
def test_one_bad_url_fails_its_own_ping_only_and_no_url_is_logged(server, pinger, caplog, bad_url):
    good = [
        ScheduleFactory(job="tests.jobs.add", args=[n, 1], ping_url=server.url(f"{KEY}-{n}"))
        for n in range(2)
    ]
    bad = ScheduleFactory(job="tests.jobs.add", args=[9, 1])
    if bad_url == "credentials":
        bad_url = server.url(KEY).replace("//", f"//user:{KEY.split('/')[-1]}@")
    # Written past clean(), as update() and bulk_create() do; the CHECK holds the scheme only.
    Schedule.objects.filter(pk=bad.pk).update(ping_url=bad_url)
    released = threading.Event()
    pinger.sender.post(lambda: released.wait(10))  # the sender busy: one batch of three
    with caplog.at_level(logging.DEBUG):
        for schedule in (good[0], bad, good[1]):
            run = Run.for_schedule(schedule, schedule.next_fire_at, status=Run.Status.SUCCEEDED)
            run.save()
            pinger.note(pings._noted(pings.SUCCESS, signals.of_run(signals.run_finished, run)[1]))
        released.set()
        sent(pinger)
    assert sorted(r.path for r in server.received) == [f"{KEY}-0", f"{KEY}-1"]
    logged = everything_logged(caplog.records)
    assert KEY.split("/")[-1] not in logged  # the check's key, in any URL or password
    assert not any(url in logged for url in (bad_url, *(s.ping_url for s in good)))
    (refusal,) = [r.getMessage() for r in caplog.records if "refused (not sent)" in r.getMessage()]
    assert refusal.startswith(f"Ping success of schedule {bad.name!r} (id {bad.pk}) refused")


def pingers_listening() -> int:
    """Receivers of a Pinger connected to the run signals."""
    found = 0
    for signal in signals.RUN_SIGNALS:
        for entry in signal.receivers:
            receiver = entry[1]
            target = receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
            found += isinstance(getattr(target, "__self__", None), pings.Pinger)
    return found


@pytest.mark.django_db(transaction=False)
def test_pings_follow_the_setting_five_receivers_while_on_and_none_while_off():
    pings.follow()
    assert pings.pinger() is None and pingers_listening() == 0  # off in the test settings
    with override_settings(DJANGO_PERIODIC={"PINGS": True, "PING_TIMEOUT": timedelta(seconds=3)}):
        following = pings.pinger()
        assert following is not None and following.timeout == 3.0
        assert pingers_listening() == 5  # started, finished, retried, lease lost, released
        with override_settings(
            DJANGO_PERIODIC={"PINGS": True, "PING_TIMEOUT": timedelta(seconds=1)}
        ):
            assert pings.pinger() is not following and pings.pinger().timeout == 1.0
            assert pingers_listening() == 5  # the new timeout's pinger only
    assert pings.pinger() is None and pingers_listening() == 0
