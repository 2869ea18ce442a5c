import signal
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from django_periodic.db import clock
from django_periodic.engine.loop import eventloop
from django_periodic.engine.loop.scheduler import REPLANS, Scheduler, look_ahead
from django_periodic.engine.runs import claims, leases
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from tests.factories import LeaseFactory, RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.helpers import set_cursor
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread


def due_now(**fields) -> Schedule:
    schedule = ScheduleFactory(**fields)
    set_cursor(schedule, clock.now())
    return schedule


@pytest.mark.django_db(transaction=True)
def test_once_plans_runs_and_waits_for_what_is_due():
    add = due_now(job="tests.jobs.add", args=[1, 2])
    broken = due_now(job="tests.jobs.explode")
    call_command("run_scheduler", "--once", workers=2, verbosity=0)
    assert Run.objects.get(schedule=add).status == "succeeded"
    assert Run.objects.get(schedule=add).result == 3
    assert Run.objects.get(schedule=broken).status == "failed"
    assert not SchedulerProcess.objects.exists()
    assert not Lease.objects.held().exists()


@pytest.mark.django_db(transaction=True)
def test_once_awaits_async_jobs_too():
    add = due_now(job="tests.jobs.add_later", args=[1, 2])
    broken = due_now(job="tests.jobs.explode_later")
    call_command("run_scheduler", "--once", workers=1, verbosity=0)
    assert Run.objects.get(schedule=add).result == 3
    assert Run.objects.get(schedule=broken).error_code == "RuntimeError"
    assert eventloop.current() is None  # stopped with the pool


@pytest.mark.django_db(transaction=True)
def test_plan_only_records_runs_without_executing_them():
    schedule = due_now()
    call_command("run_scheduler", "--once", "--plan-only", verbosity=0)
    assert Run.objects.get(schedule=schedule).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_boot_sweeps_runs_left_behind_by_a_dead_process():
    now = clock.now()
    dead = SchedulerProcess.objects.create(host="gone", pid=9, started_at=now, heartbeat_at=now)
    run = RunFactory(status="running", attempt=1, started_at=now - timedelta(minutes=5))
    Lease.objects.create(
        run=run,
        attempt=1,
        holder=str(dead),
        process=dead,
        acquired_at=now - timedelta(minutes=5),
        started_at=now - timedelta(minutes=5),  # its job was running when the process died
        heartbeat_at=now - timedelta(minutes=5),
        expires_at=now - timedelta(minutes=4),
    )
    call_command("run_scheduler", "--once", "--plan-only", verbosity=0)
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "lease_expired")


@pytest.mark.processes
def test_sigterm_stops_a_scheduler_cleanly(children):
    child = children.start("--workers", "2")
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    assert child.terminate() == 0
    assert not SchedulerProcess.objects.exists()


@pytest.mark.processes
@pytest.mark.parametrize(
    ("reentry", "status", "outcome"),
    [(True, "pending", "released"), (False, "failed", "interrupted")],
)
def test_sigterm_past_the_grace_gives_up_an_unfinished_run(children, reentry, status, outcome):
    schedule = due_now(
        job="tests.jobs.record", kwargs={"seconds": 120}, allow_stale_reentry=reentry
    )
    child = children.start("--workers", "1", settings={"SHUTDOWN_GRACE": 0.5})
    # Its job called, not only its run claimed: a claimed run whose thread has not called
    # the job yet is given back at the stop, whatever its schedule's reentry policy.
    started = Lease.objects.filter(started_at__isnull=False)
    wait_for(started.exists, 30, "the slow run's job to start")
    assert child.terminate() == 0
    run = Run.objects.get(schedule=schedule)
    assert (run.status, run.interruptions) == (status, 1)
    assert Lease.objects.get(run=run).outcome == outcome


@pytest.mark.processes
def test_sigterm_past_the_grace_cancels_an_awaited_run_and_gives_it_up(children):
    schedule = due_now(job="tests.jobs.linger_async", kwargs={"seconds": 600})
    child = children.start("--workers", "1", settings={"SHUTDOWN_GRACE": 0.5})
    wait_for(Execution.objects.exists, 30, "the job to start")
    assert child.terminate() == 0  # the event loop does not hold the process up
    run = Run.objects.get(schedule=schedule)
    assert (run.status, run.error_code, run.interruptions) == ("failed", "interrupted", 1)


@pytest.mark.processes
def test_a_second_sigterm_stops_waiting_for_the_grace(children):
    schedule = due_now(job="tests.jobs.linger", kwargs={"seconds": 600, "cooperative": False})
    child = children.start("--workers", "1", settings={"SHUTDOWN_GRACE": 600})
    wait_for(Execution.objects.exists, 30, "the job to start")
    child.popen.send_signal(signal.SIGTERM)
    child.wait_for_line("a second signal stops waiting")
    assert child.terminate(timeout=30) == 0  # the second signal: well before the 600 s grace
    run = Run.objects.get(schedule=schedule)
    assert (run.status, run.error_code) == ("failed", "interrupted")
    assert not SchedulerProcess.objects.exists()


@pytest.mark.processes
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_starting_exits_cleanly(children, signum):
    due_now(job="tests.jobs.record")
    child = children.start("--workers", "1", env={"PERIODIC_TEST_SLOW_IMPORT": "2"})
    child.wait_for_line("tests.jobs: loading slowly")
    child.popen.send_signal(signum)
    assert child.wait() == 0
    assert "Stop requested while starting" in child.output()
    assert not SchedulerProcess.objects.exists()
    assert not Run.objects.exists()


def three_fires_of_a_running_scheduler(children, start_in: float, **settings) -> Schedule:
    """A schedule firing every second three times from ``start_in`` seconds after a started
    scheduler registered; returns once all three succeeded and the scheduler stopped."""
    child = children.start("--workers", "2", settings=settings)
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    start = clock.now().replace(microsecond=0) + timedelta(seconds=start_in)
    schedule = ScheduleFactory(
        job="tests.jobs.record",
        interval=timedelta(seconds=1),
        start_at=start,
        end_at=start + timedelta(seconds=2),
    )
    done = Run.objects.filter(schedule=schedule, status="succeeded")
    try:
        wait_for(lambda: done.count() == 3, 30, "three succeeded runs")
    except AssertionError as exc:
        # Say what the ledger and the scheduler said: this failed once in CI, never here.
        child.terminate()
        runs = Run.objects.filter(schedule=schedule)
        runs = runs.values_list("plan_time", "status", "error_code")
        raise AssertionError(f"{exc}\nruns: {list(runs)}\n{child.output()}") from None
    assert child.terminate() == 0
    return schedule


@pytest.mark.processes
def test_a_schedule_created_while_running_fires_and_succeeds(children):
    schedule = three_fires_of_a_running_scheduler(children, 1)
    plan_times = sorted(Execution.objects.values_list("plan_time", flat=True))
    assert plan_times == [schedule.start_at + timedelta(seconds=s) for s in range(3)]


@pytest.mark.processes
def test_fires_are_planned_and_claimed_ahead_and_start_at_their_plan_time(children):
    schedule = three_fires_of_a_running_scheduler(children, 5, PLAN_AHEAD=3)
    start = schedule.start_at
    for run in Run.objects.filter(schedule=schedule):
        assert run.started_at >= run.plan_time  # held until then, never started early
    first = Run.objects.get(schedule=schedule, plan_time=start)
    assert first.created_at < start  # planned within the lead, not when due
    assert Lease.objects.get(run=first).acquired_at < start  # and claimed


@pytest.mark.processes
def test_two_schedulers_fire_every_plan_time_exactly_once(postgres, children):
    """Two processes, 100 schedules firing every second for 10 s: one run per plan time.
    (The crash suite and benchmarks/compare's steady workload run longer.)"""
    seconds = 10
    start = clock.now().replace(microsecond=0) + timedelta(seconds=3)
    end = start + timedelta(seconds=seconds - 1)
    schedules = ScheduleFactory.create_batch(
        100,
        job="tests.jobs.record",
        interval=timedelta(seconds=1),
        start_at=start,
        end_at=end,
        # Concurrency is what this test is about; overlap policies have their own tests.
        overlap="concurrent",
    )
    schedulers = [children.start("--workers", "4") for _ in range(2)]
    expected = len(schedules) * seconds
    finished = Run.objects.filter(status__in=["succeeded", "failed"])
    wait_for(lambda: finished.count() >= expected, seconds + 60, f"{expected} finished runs")
    assert [scheduler.terminate() for scheduler in schedulers] == [0, 0]
    wanted = [start + timedelta(seconds=s) for s in range(seconds)]
    for schedule in schedules:
        runs = Run.objects.filter(schedule=schedule).order_by("plan_time")
        assert [run.plan_time for run in runs] == wanted, schedule.name
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    executions = Execution.objects.values("schedule", "plan_time").annotate(n=Count("pk"))
    assert executions.count() == expected
    assert {row["n"] for row in executions} == {1}
    pids = set(Execution.objects.values_list("pid", flat=True))
    assert pids == {scheduler.pid for scheduler in schedulers}


@pytest.mark.processes
def test_a_scheduler_survives_its_database_connections_being_killed(postgres, children):
    child = children.start("--workers", "2")
    wait_for(SchedulerProcess.objects.exists, 30, "the scheduler to register")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.rowcount >= 1
    schedule = due_now(job="tests.jobs.add", args=[2, 2])
    run = Run.objects.filter(schedule=schedule, status="succeeded")
    wait_for(run.exists, 30, "a run after the connections were killed")
    assert child.terminate() == 0


def raising(error: BaseException):
    def step():
        raise error

    return step


@pytest.mark.django_db
def test_an_error_in_a_step_is_logged_and_the_loop_carries_on(caplog):
    # Only database errors were caught: any other exception left the loop, and the process.
    scheduler = Scheduler(workers=0)
    scheduler.stop.request()  # no back-off sleep in this test
    assert scheduler._guarded(raising(RuntimeError("a bug no row should trigger"))) is False
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "Unexpected error; retrying in 1 s."
    assert "RuntimeError: a bug no row should trigger" in caplog.text  # with its traceback
    assert scheduler._guarded(raising(ValueError("again"))) is False
    assert "retrying in 2 s" in caplog.text  # backing off
    assert scheduler._guarded(lambda: None) is True


@pytest.mark.django_db
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_step_that_asks_to_stop_the_process_stops_it(stop):
    with pytest.raises(stop):
        Scheduler(workers=0)._guarded(raising(stop()))


@pytest.mark.django_db(transaction=True)
def test_one_tick_plans_every_due_schedule_and_bounds_a_backlog(settings):
    """Many due schedules in small batches, one of them a day behind: one pass plans a
    run for each, and the one behind records no more than CATCHUP_LIMIT runs."""
    settings.DJANGO_PERIODIC = {"PLAN_BATCH_SIZE": 3, "CATCHUP_LIMIT": 5}
    now = clock.now()
    behind = ScheduleFactory(  # a day of fires every second, all missed
        interval=timedelta(seconds=1),
        misfire="all",
        overlap="concurrent",
        start_at=now - timedelta(days=1),
        end_at=now - timedelta(minutes=1),
    )
    set_cursor(behind, behind.start_at)
    healthy = [due_now() for _ in range(10)]
    call_command("run_scheduler", "--once", "--plan-only", verbosity=0)
    for schedule in healthy:
        assert Run.objects.filter(schedule=schedule, status="pending").count() == 1
    backlog = Run.objects.filter(schedule=behind)
    assert backlog.filter(status="pending").count() == 5
    assert backlog.exclude(status__in=["pending", "skipped"]).count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_forgets_processes_silent_past_stale_after_unless_they_hold_a_lease():
    long_ago = clock.now() - SchedulerProcess.stale_after() - timedelta(seconds=1)
    silent = SchedulerProcessFactory(heartbeat_at=long_ago)
    holding = SchedulerProcessFactory(heartbeat_at=long_ago)
    LeaseFactory(process=holding, expires_at=clock.now() + timedelta(minutes=5))
    call_command("run_scheduler", "--once", "--plan-only", verbosity=0)
    assert list(SchedulerProcess.objects.all()) == [holding]
    assert silent.pk not in SchedulerProcess.objects.values_list("pk", flat=True)


@pytest.mark.django_db
def test_a_forgotten_process_registers_again_at_its_next_heartbeat(process, now):
    SchedulerProcess.objects.filter(pk=process.pk).delete()
    leases.heartbeat(process, now)
    assert SchedulerProcess.objects.get(pk=process.pk).heartbeat_at == now


@pytest.mark.django_db(transaction=True)
def test_holding_leases_the_heartbeat_commits_before_the_sweep_so_workers_never_wait_for_it(
    postgres, monkeypatch
):
    """Workers update the leases a heartbeat extends (start marks, outcomes): its locks
    must be gone while the sweep runs, however long that takes."""
    scheduler = Scheduler(workers=1)
    scheduler.boot()
    due_now(job="tests.jobs.record", kwargs={"seconds": 1.0})
    scheduler.tick()  # claims the run; its job runs for a second
    lease = wait_for(lambda: Lease.objects.filter(started_at__isnull=False).first(), 10)
    locked_during_sweep = []

    def probe(*args, **kwargs):
        def try_lock():
            try:
                with transaction.atomic():
                    Lease.objects.select_for_update(nowait=True).get(pk=lease.pk)
                locked_during_sweep.append(False)
            except DatabaseError:
                locked_during_sweep.append(True)
            finally:
                connections.close_all()

        prober = Thread(target=try_lock)
        prober.start()
        prober.join()
        return leases.SweepResult()

    monkeypatch.setattr(leases, "sweep", probe)
    housekeeper = scheduler.housekeeper
    housekeeper.next_heartbeat = housekeeper.next_sweep = clock.now() - timedelta(seconds=1)
    try:
        scheduler.tick()
    finally:
        scheduler.stop.request()
        scheduler.shutdown()  # after the job: its outcome is recorded
    assert Lease.objects.get(pk=lease.pk).heartbeat_at > lease.heartbeat_at  # extended
    assert locked_during_sweep == [False]


@pytest.mark.processes
def test_a_cancel_request_reaches_a_running_job_through_its_notify(postgres, children):
    """A busy loop does not ask for cancel requests every tick, only when news wakes it (or
    once a heartbeat interval): the NOTIFY a cancel sends must be that news. The heartbeat
    is a minute apart here, so only the NOTIFY can tell the job in time. The schedule is due
    before the child starts: moving a cursor with update() sends no NOTIFY of its own."""
    due_now(job="tests.jobs.linger", kwargs={"seconds": 120})
    child = children.start("--workers", "1", settings={"HEARTBEAT_INTERVAL": 60})
    wait_for(Execution.objects.exists, 30, "the job to start")
    running = Run.objects.filter(status="running")
    assert leases.request_cancel(running, clock.now()) == (0, 1)
    run = wait_for(lambda: Run.objects.filter(status="cancelled").first(), 10, "the cancel")
    assert run.error_code == "cancelled"
    assert child.terminate() == 0


@pytest.mark.django_db(transaction=True)
def test_a_tick_with_many_runs_in_flight_asks_for_cancel_requests_only_on_news(postgres):
    """Each tick's statements do not grow with the runs in flight, and a timer's tick adds
    no query for cancel requests (news, a NOTIFY or a stop, does)."""
    scheduler = Scheduler(workers=1)
    scheduler.boot()
    start = clock.now() + timedelta(seconds=60)
    for i in range(50):
        schedule = ScheduleFactory(job="tests.jobs.noop")
        RunFactory(schedule=schedule, plan_time=start + timedelta(milliseconds=i))
    try:
        scheduler._claim(50, ahead=timedelta(minutes=2))
        assert len(scheduler.pool.in_flight()) == 50
        asked_by_tick = []
        for news in (True, False, True):
            scheduler.watcher.news = news
            with CaptureQueriesContext(connection) as queries:
                scheduler.tick()
            asked = [q for q in queries if "cancel_requested_at" in q["sql"]]
            asked_by_tick.append(len(asked))
        assert asked_by_tick == [1, 0, 1]
    finally:
        scheduler.stop.request()
        scheduler.shutdown()


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_due_just_before_a_release_waits_for_it_once():
    """The heartbeat locks the leases it extends; just before runs held for their plan time
    are marked started and released, it would hold up their marks, so it comes after the
    release: once, then whatever is held (a process whose releases never stop still beats)."""
    scheduler = Scheduler(workers=1)
    scheduler.boot()
    try:
        schedule = ScheduleFactory(job="tests.jobs.noop")
        RunFactory(schedule=schedule, plan_time=clock.now() + timedelta(minutes=1))
        (claim,) = claims.claim(scheduler.process, None, 1, ahead=timedelta(minutes=2))
        scheduler.pool.submit(claim)
        housekeeper = scheduler.housekeeper
        housekeeper.release_guard = timedelta(minutes=2)  # "soon", whatever the test's pace
        now = clock.now()
        housekeeper.next_heartbeat = housekeeper.next_sweep = now - timedelta(seconds=1)
        ahead = look_ahead("default")
        beats = SchedulerProcess.objects.filter(pk=scheduler.process.pk)
        beat_before = beats.values_list("heartbeat_at", flat=True).get()
        housekeeper.keep_house(scheduler.process, now, ahead)  # its release comes soon
        assert beats.values_list("heartbeat_at", flat=True).get() == beat_before
        assert housekeeper.next_heartbeat > now and housekeeper.next_sweep > now
        housekeeper.next_heartbeat = now - timedelta(seconds=1)  # due again: it beats
        housekeeper.keep_house(scheduler.process, now, ahead)
        assert beats.values_list("heartbeat_at", flat=True).get() == now
    finally:
        scheduler.stop.request()
        scheduler.shutdown()


@pytest.mark.django_db(transaction=True)
def test_a_fire_left_for_a_run_in_flight_is_looked_at_again_within_the_lead(settings):
    """A fire within the lead whose schedule has a run in flight is left to be planned when
    due; the scheduler wakes again a fraction of the lead later (the look-ahead shows the
    fire still unplanned: nothing counts what was left), and once the run has ended, plans
    the fire ahead of its time. With nothing left, that wake-up is not asked for."""
    lead = timedelta(seconds=4)
    settings.DJANGO_PERIODIC = {"PLAN_AHEAD": lead}
    scheduler = Scheduler(workers=0)
    scheduler.boot()
    fire = clock.now() + timedelta(seconds=3)
    schedule = ScheduleFactory(interval=timedelta(hours=1), start_at=fire)
    in_flight = RunFactory(schedule=schedule, plan_time=fire - timedelta(hours=1), status="running")
    try:
        now, wake = scheduler.tick()
        assert not Run.objects.filter(schedule=schedule, plan_time=fire).exists()
        assert wake == now + lead / REPLANS  # looked at again, long before the fire
        Run.objects.filter(pk=in_flight.pk).update(status="succeeded")
        while clock.now() < wake:  # the database's clock: the one the tick reads
            time.sleep(0.05)
        now, wake = scheduler.tick()
        planned = Run.objects.get(schedule=schedule, plan_time=fire)
        assert planned.created_at < fire  # planned ahead
        now, wake = scheduler.tick()  # nothing left within the lead: no early wake-up
        assert wake > now + lead / REPLANS
    finally:
        scheduler.stop.request()
        scheduler.shutdown()
