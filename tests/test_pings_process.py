"""Pings from a real ``run_scheduler`` process (PostgreSQL): a monitor that accepts the
connection and never answers holds up its own host's sender only; the schedules keep
running (their runs' rows are the oracle), the other schedule's pings still reach their
server as its runs end, and the scheduler stops as quickly as without."""

from collections import defaultdict
from datetime import datetime, timedelta

import pytest

from django_periodic.db import clock
from django_periodic.models import Lease, Run
from tests.factories import ScheduleFactory
from tests.ping_servers import HangingServer, RecordingServer
from tests.processes import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SECOND = timedelta(seconds=1)
HEALTHY = 10
# Seconds of fires counted once the monitor hangs, and the share of them that must have run
# (generous: a loaded machine runs late; a loop held up by a ping would run none).
WATCHED, KEPT = 5, 0.5


@pytest.fixture
def servers():
    hanging, recording = HangingServer(), RecordingServer()
    yield hanging, recording
    hanging.close()
    recording.close()


def test_a_hanging_monitor_holds_up_neither_the_runs_nor_the_other_pings(
    postgres, children, servers
):
    hanging, recording = servers
    for n in range(HEALTHY):
        ScheduleFactory(
            name=f"hung-{n:02}",
            job="tests.jobs.add",
            args=[n, 1],
            interval=SECOND,
            ping_url=hanging.url(f"/ping/hung-{n}"),
        )
    ScheduleFactory(
        name="watched",
        job="tests.jobs.add",
        args=[0, 0],
        interval=timedelta(seconds=2),
        ping_url=recording.url("/ping/watched"),
    )
    child = children.start(settings={"PINGS": True, "PING_TIMEOUT": 0.5})
    wait_for(lambda: hanging.accepted, 60, "a ping to reach the hanging server")
    hung_since = clock.now()
    watched_until = hung_since + WATCHED * SECOND
    hung_runs = Run.objects.filter(schedule__name__startswith="hung-")
    later = hung_runs.filter(plan_time__gte=watched_until, status=Run.Status.SUCCEEDED)
    wait_for(
        lambda: later.values("schedule").distinct().count() == HEALTHY,
        60,
        f"every schedule to run {WATCHED} s after the monitor hung",
    )
    ran = hung_runs.filter(plan_time__gte=hung_since, plan_time__lt=watched_until)
    assert ran.filter(status=Run.Status.SUCCEEDED).count() >= KEPT * HEALTHY * WATCHED

    # The watched schedule's pings reach their server while the hung ones time out: a start
    # and its end for a run planned once the hang was WATCHED s old. Queued behind the hung
    # pings (HEALTHY x 2 a second, 0.5 s each: 10 s of waiting a second), they would come
    # ever later: these about 50 s after the hang began.
    wait_for(
        lambda: paired_since(recording, watched_until),
        30,
        "a start and end ping of a watched run planned after the hang",
    )
    assert child.terminate(timeout=60) == 0
    output = child.output()
    assert "no answer in 0.5 s" in output
    # One wait at exit for all the pings' senders, the hung host's included.
    assert output.count("not all were sent") == 1, output
    assert "/ping/hung-" not in output and f"127.0.0.1:{hanging.port}" not in output


def paired_since(server: RecordingServer, since) -> bool:
    """A start and its end, paired by ``rid``, of a run planned at ``since`` or later."""
    paths = defaultdict(set)
    for received in list(server.received):
        if datetime.fromisoformat(received.outcome["plan_time"]) >= since:
            paths[received.query["rid"]].add(received.path)
    return {"/ping/watched/start", "/ping/watched"} in paths.values()


@pytest.mark.parametrize("reentry", [True, False])
def test_a_run_given_back_at_shutdown_pings_fail_once_for_its_attempt(
    postgres, children, servers, reentry
):
    """A stop past the grace gives up the running job: run again later (reentry) or failed
    ``interrupted``; either way its attempt's start is closed by one ``/fail``."""
    _, recording = servers
    schedule = ScheduleFactory(
        name="slow",
        job="tests.jobs.record",
        kwargs={"seconds": 120},
        interval=timedelta(hours=1),
        start_at=clock.now() + SECOND,
        allow_stale_reentry=reentry,
        ping_url=recording.url("/ping/slow"),
    )
    child = children.start(
        "--workers", "1", settings={"PINGS": True, "PING_TIMEOUT": 5, "SHUTDOWN_GRACE": 0.5}
    )
    wait_for(Lease.objects.filter(started_at__isnull=False).exists, 30, "the job to start")
    assert child.terminate() == 0, child.output()
    start, end = recording.wait_for(2)
    assert (start.path, end.path) == ("/ping/slow/start", "/ping/slow/fail")
    assert start.query["rid"] == end.query["rid"]
    assert end.outcome["error_code"] == "interrupted"
    run = Run.objects.get(schedule=schedule)
    assert (end.outcome["status"], run.status) == (("pending",) * 2 if reentry else ("failed",) * 2)
    assert len(recording.received) == 2  # the process exited: nothing more can come
