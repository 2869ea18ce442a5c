import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from django_periodic.engine import records
from django_periodic.engine.backends.postgresql import claims as pg_claims
from django_periodic.engine.records import Claim
from django_periodic.engine.runs import claims, leases, outcomes, retries
from django_periodic.models import Lease, Run, SchedulerProcess
from tests import ledger
from tests.factories import RunFactory, ScheduleFactory, SchedulerProcessFactory
from tests.threads import Thread


def claim_one(process, now, *, started=True, **schedule_fields) -> Claim:
    """Claim a new run of a new schedule; ``started``: its job was called (its lease says so)."""
    RunFactory(schedule=ScheduleFactory(**schedule_fields), plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    if started:
        assert leases.mark_started([claim.token]) == {claim.token}
    return claim


def failure(retryable=True) -> records.Failure:
    return records.Failure("ValueError", "bad value", "Traceback ...", retryable)


@pytest.mark.django_db
def test_a_claim_sets_the_run_running_under_a_new_lease(process, now):
    claim = claim_one(process, now, lease_timeout=timedelta(seconds=30))
    run = Run.objects.get(pk=claim.run.pk)
    lease = Lease.objects.get(token=claim.token)
    assert (run.status, run.attempt, run.started_at) == ("running", 1, now)
    assert (lease.attempt, lease.holder, lease.process_id) == (1, "test:1", process.pk)
    assert lease.expires_at == now + timedelta(seconds=30)


@pytest.mark.django_db
def test_claim_takes_at_most_the_limit_oldest_first(process, now):
    runs = [RunFactory(plan_time=now - timedelta(seconds=s)) for s in (1, 3, 2)]
    taken = claims.claim(process, now, 2)
    assert [c.run.pk for c in taken] == [runs[1].pk, runs[2].pk]


@pytest.mark.django_db
def test_a_claim_ahead_takes_only_runs_due_within_the_lead_and_starts_them_then(process, now):
    due = RunFactory(plan_time=now)
    soon = RunFactory(plan_time=now + timedelta(seconds=1))
    RunFactory(plan_time=now + timedelta(seconds=5))
    (claim,) = claims.claim(process, now, 10, ahead=timedelta(seconds=2))
    assert claim.run.pk == soon.pk
    assert Run.objects.get(pk=soon.pk).started_at == now + timedelta(seconds=1)
    assert claim.db_claimed_at == now
    assert Lease.objects.get(token=claim.token).acquired_at == now
    assert [c.run.pk for c in claims.claim(process, now, 10)] == [due.pk]  # not ahead


@pytest.mark.django_db
def test_a_run_planned_ahead_is_not_claimed_to_start_before_its_plan_time(process, now):
    RunFactory(plan_time=now + timedelta(seconds=1))
    assert claims.claim(process, now, 10) == []
    assert len(claims.claim(process, now + timedelta(seconds=1), 10)) == 1


@pytest.mark.django_db
def test_retries_are_claimable_only_once_their_delay_has_passed(process, now):
    RunFactory(status="retrying", next_retry_at=now + timedelta(seconds=5))
    assert claims.claim(process, now, 10) == []
    assert len(claims.claim(process, now + timedelta(seconds=5), 10)) == 1


@pytest.mark.django_db
def test_success_records_the_result_and_releases_the_lease(process, now):
    claim = claim_one(process, now)
    assert ledger.succeed(claim, now + timedelta(seconds=2), {"ok": True})
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.result, run.duration) == (
        "succeeded",
        {"ok": True},
        timedelta(seconds=2),
    )
    assert Lease.objects.get(token=claim.token).outcome == "succeeded"


@pytest.mark.django_db
def test_a_failure_with_attempts_left_retries_after_a_backoff(process, now):
    claim = claim_one(process, now, max_attempts=3, retry_backoff=timedelta(seconds=10))
    assert ledger.fail(claim, now, failure()) == "retrying"
    run = Run.objects.get(pk=claim.run.pk)
    assert run.status == "retrying"
    assert now + timedelta(seconds=5) <= run.next_retry_at <= now + timedelta(seconds=10)
    assert (run.error_code, run.error_message) == ("ValueError", "bad value")


@pytest.mark.django_db
def test_the_last_attempt_fails_the_run(process, now):
    claim = claim_one(process, now, max_attempts=1)
    assert ledger.fail(claim, now, failure()) == "failed"
    assert Run.objects.get(pk=claim.run.pk).status == "failed"


@pytest.mark.django_db
def test_a_failure_that_is_not_retryable_fails_at_once(process, now):
    claim = claim_one(process, now, max_attempts=5)
    assert ledger.fail(claim, now, failure(retryable=False)) == "failed"


def test_backoff_doubles_with_jitter_and_is_capped():
    base = timedelta(seconds=10)
    for attempt, nominal in ((1, 10), (2, 20), (3, 40)):
        delay = retries.retry_delay(base, attempt).total_seconds()
        assert nominal / 2 <= delay <= nominal
    assert retries.retry_delay(base, 200) <= retries.MAX_RETRY_DELAY


@pytest.mark.django_db
def test_a_lost_lease_cannot_overwrite_a_newer_attempt(process, now):
    claim = claim_one(process, now, allow_stale_reentry=True, lease_timeout=timedelta(seconds=5))
    later = now + timedelta(seconds=6)
    assert leases.sweep(later).reentered == 1
    (newer,) = claims.claim(process, later, 1)
    assert newer.run.attempt == 2
    assert not ledger.succeed(claim, later, "stale result")
    assert ledger.fail(claim, later, failure()) is None
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.attempt, run.result) == ("running", 2, None)
    assert ledger.succeed(newer, later, "fresh")
    assert Run.objects.get(pk=claim.run.pk).result == "fresh"


@pytest.mark.django_db
def test_an_expired_lease_fails_the_run_without_stale_reentry(process, now):
    claim = claim_one(process, now, lease_timeout=timedelta(seconds=5))
    assert leases.sweep(now + timedelta(seconds=5)).failed == 0  # not yet expired
    assert leases.sweep(now + timedelta(seconds=6)).failed == 1
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.error_code, run.interruptions) == ("failed", "lease_expired", 1)
    assert Lease.objects.get(token=claim.token).outcome == "expired"


@pytest.mark.django_db
def test_a_released_lease_names_no_process_so_a_process_goes_without_rewriting_history(
    process, now
):
    """Every way a lease is released (an outcome, a release at shutdown, the sweeper) drops
    its process; the holder still says who it was. Deleting the process, as its stop or the
    sweeper does, then has only the leases it still holds to update."""
    done, given_up, expired, held = (
        claim_one(process, now, lease_timeout=timedelta(seconds=5)) for _ in range(4)
    )
    assert ledger.succeed(done, now, "ok")
    assert ledger.release(given_up, now)
    Lease.objects.filter(token=held.token).update(expires_at=now + timedelta(hours=1))
    assert leases.sweep(now + timedelta(seconds=6)).failed == 1
    released = Lease.objects.filter(token__in=[done.token, given_up.token, expired.token])
    assert [(lease.process_id, lease.holder) for lease in released] == [(None, "test:1")] * 3
    assert list(Lease.objects.filter(process=process).values_list("token", flat=True)) == [
        held.token
    ]


@pytest.mark.django_db
def test_stale_reentry_is_bounded(process, now, settings):
    settings.DJANGO_PERIODIC = {"STALE_REENTRY_LIMIT": 2}
    claim_one(process, now, allow_stale_reentry=True, lease_timeout=timedelta(seconds=1))
    moment = now
    for expected in ("pending", "pending", "failed"):
        moment += timedelta(seconds=2)
        leases.sweep(moment)
        assert Run.objects.get().status == expected
        for claim in claims.claim(process, moment, 1):
            leases.mark_started([claim.token])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "allow_stale_reentry", [False, True], ids=["at-most-once", "at-least-once"]
)
def test_a_run_whose_job_never_started_is_run_again_whatever_its_policy(
    process, now, allow_stale_reentry
):
    """Claimed ahead, or waiting for a thread, when its process died: nothing of it ran."""
    schedule = {"allow_stale_reentry": allow_stale_reentry, "lease_timeout": timedelta(seconds=5)}
    claim = claim_one(process, now, started=False, **schedule)
    assert leases.sweep(now + timedelta(seconds=6)) == leases.SweepResult(reentered=1, failed=0)
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.error_code) == ("pending", "")
    (again,) = claims.claim(process, now + timedelta(seconds=6), 1)
    assert again.run.pk == run.pk


@pytest.mark.django_db
def test_a_run_whose_job_never_started_is_run_again_however_often(process, now, settings):
    """STALE_REENTRY_LIMIT bounds runs whose job may be what kills its process; one whose
    job never started cannot be."""
    settings.DJANGO_PERIODIC = {"STALE_REENTRY_LIMIT": 1}
    claim_one(process, now, started=False, lease_timeout=timedelta(seconds=1))
    moment = now
    for _ in range(3):
        moment += timedelta(seconds=2)
        assert leases.sweep(moment).reentered == 1
        claims.claim(process, moment, 1)


@pytest.mark.django_db
def test_marking_started_says_which_leases_are_still_held(process, now):
    held = claim_one(process, now, started=False, lease_timeout=timedelta(seconds=5))
    lost = claim_one(process, now, started=False, lease_timeout=timedelta(seconds=1))
    leases.sweep(now + timedelta(seconds=2))  # the short lease expired: its run is another's
    assert leases.mark_started([held.token, lost.token]) == {held.token}
    assert Lease.objects.get(token=held.token).started_at is not None
    assert Lease.objects.get(token=lost.token).started_at is None


@pytest.mark.django_db
def test_one_heartbeat_extends_every_lease_of_the_process_by_its_own_length(process, now):
    short = claim_one(process, now, lease_timeout=timedelta(seconds=10))
    long = claim_one(process, now, lease_timeout=timedelta(seconds=60))
    later = now + timedelta(seconds=8)
    assert leases.heartbeat(process, later, [short.token, long.token]) == 2
    expiries = {lease.token: lease.expires_at for lease in Lease.objects.all()}
    assert expiries[short.token] == later + timedelta(seconds=10)
    assert expiries[long.token] == later + timedelta(seconds=60)
    assert SchedulerProcess.objects.get().heartbeat_at == later


@pytest.mark.django_db
def test_a_heartbeat_extends_only_the_leases_the_process_still_holds(process, now):
    """A run it no longer holds (its outcome was not recorded) is left to the sweeper."""
    ten_seconds = {"lease_timeout": timedelta(seconds=10)}
    held, lost = claim_one(process, now, **ten_seconds), claim_one(process, now, **ten_seconds)
    other = claim_one(SchedulerProcessFactory(), now, **ten_seconds)
    assert leases.heartbeat(process, now + timedelta(seconds=8), {held.token, other.token}) == 1
    assert Lease.objects.get(token=lost.token).heartbeat_at == now
    assert Lease.objects.get(token=other.token).heartbeat_at == now  # not this process's
    assert leases.sweep(now + timedelta(seconds=12)).failed == 2  # lost's and other's
    assert Run.objects.get(pk=lost.run.pk).error_code == "lease_expired"
    assert Run.objects.get(pk=held.run.pk).status == "running"


@pytest.mark.django_db
def test_a_heartbeat_holding_no_lease_only_says_the_process_is_alive(process, now):
    claim = claim_one(process, now)
    later = now + timedelta(seconds=8)
    assert leases.heartbeat(process, later) == 0
    assert SchedulerProcess.objects.get().heartbeat_at == later
    assert Lease.objects.get(token=claim.token).heartbeat_at == now


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_skips_a_lease_being_released_instead_of_waiting_for_it(postgres, process, now):
    """Waiting would deadlock with a recorder releasing the same leases in another order."""
    releasing, other = claim_one(process, now), claim_one(process, now)
    locked, done = threading.Event(), threading.Event()

    def recorder_mid_release():
        with transaction.atomic():
            Lease.objects.select_for_update().get(token=releasing.token)
            locked.set()
            done.wait(10)
        connections.close_all()

    thread = Thread(target=recorder_mid_release)
    thread.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # waiting would fail the test
        held = [releasing.token, other.token]
        assert leases.heartbeat(process, now + timedelta(seconds=1), held) == 1
    finally:
        done.set()
        thread.join()
    assert Lease.objects.get(token=other.token).heartbeat_at == now + timedelta(seconds=1)
    assert Lease.objects.get(token=releasing.token).heartbeat_at == now


@pytest.mark.django_db
def test_release_gives_a_reentrant_run_back_for_another_process(process, now):
    claim = claim_one(process, now, allow_stale_reentry=True)
    assert ledger.release(claim, now)
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.interruptions) == ("pending", 1)
    (again,) = claims.claim(process, now, 1)
    assert again.run.attempt == 2


@pytest.mark.django_db
def test_release_fails_an_at_most_once_run_rather_than_run_it_twice(process, now):
    claim = claim_one(process, now, allow_stale_reentry=False)
    assert ledger.release(claim, now)
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.error_code) == ("failed", "interrupted")
    assert claims.claim(process, now, 1) == []


@pytest.mark.django_db
def test_finishing_a_run_promotes_the_next_queued_one(process, now):
    claim = claim_one(process, now, overlap="queue")
    queued = RunFactory(schedule=claim.run.schedule, plan_time=now + timedelta(1), status="queued")
    ledger.succeed(claim, now, None)
    queued.refresh_from_db()
    assert queued.status == "pending"


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_claim_a_run_twice(postgres, now):
    RunFactory.create_batch(60, plan_time=now)
    processes = SchedulerProcessFactory.create_batch(4, started_at=now)
    claimed: list[int] = []
    barrier = threading.Barrier(len(processes))

    def claim_all(process):
        try:
            barrier.wait()
            while batch := claims.claim(process, now, 5):
                claimed.extend(claim.run.pk for claim in batch)
        finally:
            connections.close_all()

    threads = [Thread(target=claim_all, args=(p,)) for p in processes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(Run.objects.values_list("pk", flat=True))
    assert Lease.objects.count() == 60


@pytest.mark.django_db
def test_a_retry_does_not_promote_a_queued_run(process, now):
    claim = claim_one(process, now, overlap="queue", max_attempts=2)
    queued = RunFactory(schedule=claim.run.schedule, plan_time=now + timedelta(1), status="queued")
    ledger.fail(claim, now, failure())
    queued.refresh_from_db()
    assert queued.status == "queued"


@pytest.mark.django_db
def test_a_sweep_that_fails_a_run_promotes_the_next_queued_one(process, now):
    claim = claim_one(process, now, overlap="queue", lease_timeout=timedelta(seconds=1))
    queued = RunFactory(schedule=claim.run.schedule, plan_time=now + timedelta(1), status="queued")
    leases.sweep(now + timedelta(seconds=2))
    queued.refresh_from_db()
    assert queued.status == "pending"


@pytest.mark.django_db
def test_outcomes_keep_any_text_and_long_retry_delays_as_given(process, now):
    """Recorded many per statement, as array literals: nothing may be misread."""
    tricky = 'say "NULL", {a,b} \\ back\nslash'
    ok, failing = claim_one(process, now), claim_one(process, now, max_attempts=2)
    retry = replace(
        outcomes.failed(failing, records.Failure("E", tricky, tricky)),
        retry_in=timedelta(days=2, seconds=1.5),
    )
    recorded = outcomes.record([outcomes.succeeded(ok, {"text": tricky}), retry], now)
    assert recorded == {ok.run.pk, failing.run.pk}
    assert Run.objects.get(pk=ok.run.pk).result == {"text": tricky}
    run = Run.objects.get(pk=failing.run.pk)
    assert (run.error_message, run.traceback) == (tricky, tricky)
    assert run.next_retry_at == now + timedelta(days=2, seconds=1.5)


def plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.parametrize("ahead", [None, timedelta(seconds=1)], ids=["due", "ahead"])
def test_a_claim_reads_runs_in_plan_time_order_even_on_stale_statistics(postgres, now, ahead):
    """A burst of runs into a table the statistics saw empty (as for a minute after a
    fan-out) must not make each claim sort every waiting run: the claim scans the index
    of claimable runs from its clock, in order."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Run._meta.db_table}")  # statistics of an empty table
    schedule = ScheduleFactory(overlap="concurrent")
    Run.objects.bulk_create(
        Run.for_schedule(schedule, now - timedelta(microseconds=i)) for i in range(5_000)
    )
    sql = pg_claims._claim_sql("default", ahead is not None, False)
    params = {"now": now, "ahead": ahead, "limit": 20, "latest": now, "started": False}
    params |= dict.fromkeys(["late_code", "late_message", "refused_code", "refused_message"], "")
    params |= {"holder": "test", "process": None, "run_id": None, "jobs": [schedule.job]}
    params |= pg_claims._too_late("default")[1]  # the late rule's parameters
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (((plan,),),) = [cursor.fetchall()]
    nodes = list(plan_nodes(plan[0]["Plan"]))
    (picking,) = [n for n in nodes if n.get("Alias") == "r" and "Index Cond" in n]
    assert picking["Index Name"] == "periodic_run_claimable"
    assert "plan_time" in picking["Index Cond"]
    assert "Sort" not in [n["Node Type"] for n in nodes]
