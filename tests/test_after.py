"""Runs after runs: a downstream schedule gets exactly one run (or skipped run) for each plan
time its upstreams ran for, decided by their runs' ends and its wait bound; a bad ``after``
is refused by validation and, stored anyway, fails that schedule alone."""

import signal
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_periodic.choices import ErrorCode
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.engine.backends import ledger
from django_periodic.engine.planning import planner
from django_periodic.engine.planning.after import plan_after
from django_periodic.models import Run, Schedule
from tests import crash
from tests.factories import RunFactory, ScheduleFactory, schedule_form_data
from tests.jobs import picked
from tests.models import Execution
from tests.processes import wait_for
from tests.test_bad_rows import unchecked  # noqa: F401 (a fixture)
from tests.test_crash import seed  # noqa: F401 (a fixture)
from tests.test_signals import received  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

T1 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
T2 = T1 + timedelta(hours=1)
T3 = T1 + timedelta(hours=2)
EARLY = T1 - timedelta(days=1)  # when the schedules were made: before their plan times


def upstream(name: str, **fields) -> Schedule:
    schedule = ScheduleFactory(name=name, **fields)
    Schedule.objects.filter(pk=schedule.pk).update(created_at=EARLY)
    return schedule


def downstream(name: str, after: list[str], **fields) -> Schedule:
    schedule = ScheduleFactory(name=name, interval=None, after=after, **fields)
    Schedule.objects.filter(pk=schedule.pk).update(created_at=EARLY)
    return schedule


def ran(schedule: Schedule, plan_time: datetime, status: str, scope: str = "") -> Run:
    return RunFactory(schedule=schedule, plan_time=plan_time, status=status, scope=scope)


def fates(schedule: Schedule) -> list[tuple]:
    runs = Run.objects.filter(schedule=schedule).order_by("plan_time", "scope")
    return list(runs.values_list("plan_time", "scope", "status", "error_code"))


# -- A -> B ----------------------------------------------------------------------------------


def test_each_plan_time_an_upstream_succeeded_gives_the_downstream_one_run():
    a = upstream("a")
    b = downstream("b", ["a"])
    ran(a, T1, "succeeded")
    ran(a, T2, "failed")
    ran(a, T3, "running")
    result = plan_after(T3 + timedelta(minutes=1))
    assert fates(b) == [
        (T1, "", "pending", ""),
        (T2, "", "skipped", ErrorCode.UPSTREAM_FAILED),
    ]
    assert "'a' ended failed" in Run.objects.get(schedule=b, plan_time=T2).error_message
    assert result.next_check == T3 + timedelta(minutes=1, seconds=1)  # 'a' is in flight at T3
    plan_after(T3 + timedelta(minutes=2))
    assert len(fates(b)) == 2  # decided once, whatever passes follow
    Run.objects.filter(schedule=a, plan_time=T3).update(status="succeeded")
    plan_after(T3 + timedelta(minutes=3))
    assert fates(b)[-1] == (T3, "", "pending", "")


def test_a_downstream_run_snapshots_its_own_job_and_starts_from_now():
    a = upstream("a")
    b = downstream("b", ["a"], job="tests.jobs.add", args=[1, 2])
    ran(a, T1, "succeeded")
    now = T1 + timedelta(minutes=5)
    plan_after(now)
    run = Run.objects.get(schedule=b)
    assert (run.job_name, run.args, run.trigger, run.release_at) == (
        "tests.jobs.add", [1, 2], "schedule", now,
    )  # fmt: skip
    assert run.start_deadline == now + b.misfire_grace


def test_a_downstream_run_has_its_deadline_from_the_plan_time():
    """``finish_within`` counts from the plan time, the upstreams' time included."""
    a = upstream("a")
    b = downstream("b", ["a"], finish_within=timedelta(hours=2))
    ran(a, T1, "succeeded")
    plan_after(T1 + timedelta(minutes=50))
    assert Run.objects.get(schedule=b, plan_time=T1).finish_by == T1 + timedelta(hours=2)


# In the test's transaction: the CHECK constraints it drops come back with its rollback.
@pytest.mark.django_db(transaction=False)
@pytest.mark.usefixtures("unchecked")
def test_a_finish_within_stored_out_of_range_fails_that_downstream_alone():
    a = upstream("a")
    bad, good = downstream("bad", ["a"]), downstream("good", ["a"])
    Schedule.objects.filter(pk=bad.pk).update(finish_within=timedelta(days=-1))
    ran(a, T1, "succeeded")
    result = plan_after(T1 + timedelta(minutes=1))
    assert result.failed == ["bad"]
    assert [fate[2] for fate in fates(good)] == ["pending"]
    assert not Run.objects.filter(schedule=bad).exists()


def test_finished_counts_any_end_state_of_the_upstream():
    a = upstream("a")
    b = downstream("b", ["a"], after_outcome="finished")
    ran(a, T1, "failed")
    ran(a, T2, "cancelled")
    plan_after(T3)
    assert [status for _, _, status, _ in fates(b)] == ["pending", "pending"]


def test_plan_times_before_the_downstream_existed_are_not_run():
    a = upstream("a")
    ran(a, T1, "succeeded")
    b = downstream("b", ["a"])
    Schedule.objects.filter(pk=b.pk).update(created_at=T1 + timedelta(seconds=1))
    ran(a, T2, "succeeded")
    plan_after(T3)
    assert fates(b) == [(T2, "", "pending", "")]


def test_a_paused_downstream_records_its_plan_times_in_the_pause_skipped():
    a = upstream("a")
    b = downstream("b", ["a"])
    Schedule.objects.filter(pk=b.pk).update(paused_until=T2)
    ran(a, T1, "succeeded")
    ran(a, T2, "succeeded")
    plan_after(T3)
    assert fates(b) == [(T1, "", "skipped", ErrorCode.PAUSED), (T2, "", "pending", "")]


# -- all of several --------------------------------------------------------------------------


def test_a_downstream_of_two_runs_only_when_both_succeeded():
    a, c = upstream("a"), upstream("c")
    d = downstream("d", ["a", "c"], after_wait=timedelta(minutes=30))
    ran(a, T1, "succeeded")
    ran(c, T1, "running")
    now = T1 + timedelta(minutes=10)
    assert plan_after(now).next_check == now + timedelta(seconds=1)  # c is in flight
    assert fates(d) == []
    Run.objects.filter(schedule=c).update(status="succeeded")
    plan_after(T1 + timedelta(minutes=11))
    assert fates(d) == [(T1, "", "pending", "")]


def test_an_upstream_late_past_the_wait_bound_skips_the_plan_time_naming_it():
    a, c = upstream("a"), upstream("c")
    d = downstream("d", ["a", "c"], after_wait=timedelta(minutes=30))
    ran(a, T1, "succeeded")  # c has no run for T1 at all
    # Nothing in flight: the pass asks to look again at the wait bound, not before.
    assert plan_after(T1 + timedelta(minutes=10)).next_check == T1 + timedelta(minutes=30)
    assert fates(d) == []
    plan_after(T1 + timedelta(minutes=30))
    assert fates(d) == [(T1, "", "skipped", ErrorCode.UPSTREAM_LATE)]
    assert "'c' was not done within" in Run.objects.get(schedule=d).error_message
    ran(c, T1, "succeeded")  # too late: the plan time was decided
    plan_after(T1 + timedelta(minutes=40))
    assert fates(d) == [(T1, "", "skipped", ErrorCode.UPSTREAM_LATE)]


# -- scopes ----------------------------------------------------------------------------------


def test_a_fanned_out_upstream_gives_one_downstream_run_per_scope_key():
    a = upstream("a", job="tests.jobs.per_tenant", scopes="tests.jobs.tenants")
    b = downstream("b", ["a"])
    ran(a, T1, "succeeded", scope="acme")
    ran(a, T1, "failed", scope="globex")
    ran(a, T1, "running", scope="initech")
    plan_after(T1 + timedelta(minutes=1))
    assert fates(b) == [
        (T1, "acme", "pending", ""),
        (T1, "globex", "skipped", ErrorCode.UPSTREAM_FAILED),
    ]


# -- the clock's planning leaves it alone ----------------------------------------------------


def test_a_downstream_has_no_cursor_and_the_clock_planner_never_takes_it():
    upstream("a")
    b = downstream("b", ["a"])
    assert b.next_fire_at is None and b.trigger_kind == "after" and b.is_downstream
    assert b.next_fire_times(3) == []
    assert not Schedule.objects.due(clock.now() + timedelta(days=400)).filter(pk=b.pk).exists()
    planner.plan_due(clock.now() + timedelta(days=1))
    assert fates(b) == []
    assert list(Schedule.objects.of_kind("after")) == [b]


# -- validation ------------------------------------------------------------------------------


def test_full_clean_refuses_a_cycle_itself_a_missing_name_and_a_second_trigger():
    upstream("a")
    b = downstream("b", ["a"])
    a = Schedule.objects.get(name="a")
    a.interval, a.after = None, ["b"]
    with pytest.raises(ValidationError) as cycle:
        a.full_clean()
    assert "cycle: a -> b -> a" in str(cycle.value.message_dict["after"])
    b.after = ["b"]
    with pytest.raises(ValidationError, match="after itself"):
        b.full_clean()
    b.after = ["nobody"]
    with pytest.raises(ValidationError, match="'nobody'"):
        b.full_clean()
    b.after, b.cron = ["a"], "* * * * *"
    with pytest.raises(ValidationError, match="exactly one trigger"):
        b.full_clean()
    b.cron, b.after_wait = "", timedelta(0)
    with pytest.raises(ValidationError) as wait:
        b.full_clean()
    assert "after_wait" in wait.value.message_dict


def test_the_admin_form_refuses_a_cycle(admin_client):
    upstream("a")
    downstream("b", ["a"])
    a = Schedule.objects.get(name="a")
    url = reverse("admin:django_periodic_schedule_change", args=[a.pk])
    data = schedule_form_data(
        name="a", job="tests.jobs.noop", args="[]", trigger_kind="after", cron="",
        after='["b"]',
    )  # fmt: skip
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "cycle: a -&gt; b -&gt; a" in response.content.decode()
    a.refresh_from_db()
    assert a.after == []
    fixed = {**data, "after": "[]", "trigger_kind": "cron", "cron": "* * * * *"}
    ok = admin_client.post(url, fixed)
    assert ok.status_code == 302


def test_the_admin_form_saves_a_downstream():
    from django_periodic.admin.forms import ScheduleForm

    upstream("a")
    data = schedule_form_data(name="b", trigger_kind="after", cron="", after='["a"]')
    form = ScheduleForm(data)
    assert form.is_valid(), form.errors
    b = form.save()
    assert (b.after, b.cron, b.next_fire_at) == (["a"], "", None)


# -- bad rows stored past validation ---------------------------------------------------------


def test_a_cycle_stored_by_update_fails_those_schedules_alone():
    a, x = upstream("a"), upstream("x")
    b = downstream("b", ["a"])
    e = downstream("e", ["x"])
    Schedule.objects.filter(pk=a.pk).update(interval=None, after=["b"])
    ran(x, T1, "succeeded")
    limit = get_settings().PLANNING_FAILURE_LIMIT
    for minute in range(limit):
        result = plan_after(T1 + timedelta(minutes=minute))
        assert sorted(result.failed) == (["a", "b"] if minute < limit else [])
    assert fates(e) == [(T1, "", "pending", "")]  # the others are planned as ever
    b.refresh_from_db()
    assert "cycle: b -> a -> b" in b.last_error
    assert (b.attention_reason, b.enabled) == ("upstream", False)  # the bad-row rules
    assert set(Schedule.objects.needing_attention().values_list("name", flat=True)) == {"a", "b"}


def test_a_value_of_the_wrong_shape_fails_that_schedule_alone():
    upstream("a")
    b = downstream("b", ["a"])
    Schedule.objects.filter(pk=b.pk).update(after={"not": "a list"})
    assert plan_after(T1).failed == ["b"]
    b.refresh_from_db()
    assert "JSON list" in b.last_error and b.planning_failures == 1


def test_a_deleted_upstream_shows_in_attention_and_its_return_clears_it():
    a = upstream("a")
    b = downstream("b", ["a"])
    a.delete()
    plan_after(T1)
    b.refresh_from_db()
    assert "'a'" in b.last_error and b.attention_reason == "upstream"
    assert list(Schedule.objects.needing_attention()) == [b]
    upstream("a")
    plan_after(T1)
    b.refresh_from_db()
    assert (b.last_error, b.attention_reason, b.planning_failures) == ("", "", 0)


def test_a_disabled_upstream_is_said_while_the_downstream_stays_enabled():
    upstream("a", enabled=False)
    b = downstream("b", ["a"])
    plan_after(T1)
    b.refresh_from_db()
    assert "'a', which is disabled" in b.last_error and b.enabled
    assert list(Schedule.objects.needing_attention()) == [b]


def test_the_attention_pass_leaves_the_upstream_reason_alone():
    from django_periodic.engine.planning import attention

    a = upstream("a")
    b = downstream("b", ["a"])
    a.delete()
    plan_after(T1)
    attention.evaluate(clock.now())
    b.refresh_from_db()
    assert b.attention_reason == "upstream"


# -- cost --------------------------------------------------------------------------------------


def _queries_of_a_pass(n: int) -> int:
    for i in range(n):
        up = upstream(f"up-{n}-{i}")
        downstream(f"down-{n}-{i}", [up.name])
        ran(up, T1, "succeeded")
    with CaptureQueriesContext(connection) as queries:
        plan_after(T1 + timedelta(minutes=1))
    assert Run.objects.filter(schedule__name__startswith=f"down-{n}-").count() == n
    Schedule.objects.all().delete()
    return len(queries)


def test_each_downstream_run_recorded_is_announced_once(received):  # noqa: F811 (the fixture)
    a = upstream("a")
    b = downstream("b", ["a"])
    ran(a, T1, "succeeded")
    ran(a, T2, "failed")
    plan_after(T2 + timedelta(minutes=1))
    plan_after(T2 + timedelta(minutes=2))  # decided already: nothing more to announce
    runs = {run.plan_time: run for run in Run.objects.filter(schedule=b)}
    common = {"schedule_id": b.pk, "schedule": "b", "scope": "", "attempt": 0}
    assert received.of("planned") == [
        common
        | {"run_id": runs[T1].pk, "plan_time": T1, "status": "pending", "reason": ""}
        | {"using": "default"}
    ]
    reason = ErrorCode.UPSTREAM_FAILED
    assert received.of("skipped") == [
        common
        | {"run_id": runs[T2].pk, "plan_time": T2, "status": "skipped", "reason": reason}
        | {"using": "default"}
    ]


def test_a_plan_time_another_process_recorded_first_is_left_to_it_and_not_returned():
    # What a pass inserts once another process's pass recorded T1 after this one read.
    upstream("a")
    b = downstream("b", ["a"])
    theirs = RunFactory(schedule=b, plan_time=T1, exclusive=False, status="pending")
    decided = [
        RunFactory.build(schedule=b, plan_time=plan_time, exclusive=False, status="pending")
        for plan_time in (T1, T2)
    ]
    inserted = ledger("default").insert_new_runs(decided)
    ours = Run.objects.exclude(pk=theirs.pk).get(schedule=b)
    assert inserted == [(ours.pk, b.pk, "", T2, "pending", "")]
    assert sorted(fates(b)) == [(T1, "", "pending", ""), (T2, "", "pending", "")]


def test_a_pass_costs_the_same_statements_for_2_or_20_downstream_schedules():
    # Three reads and one INSERT in its transaction; on PostgreSQL a NOTIFY for the workers.
    assert _queries_of_a_pass(2) == _queries_of_a_pass(20) <= 7


def test_a_pass_without_downstream_schedules_is_one_statement():
    ScheduleFactory.create_batch(5)
    with CaptureQueriesContext(connection) as queries:
        plan_after(T1)
    assert len(queries) == 1


# -- real processes --------------------------------------------------------------------------


@pytest.mark.crash
@pytest.mark.processes
def test_every_upstream_success_has_exactly_one_downstream_execution_under_a_kill(
    children, postgres
):
    """Two run_scheduler processes, an upstream every second and a downstream after it; one
    process is killed mid-way. Both jobs are atomic: a job's row commits with its run's
    success, so the rows are the successes, a killed attempt leaving none. By the jobs' own
    rows: every plan time the upstream succeeded for has exactly one downstream row."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=3)
    job = "tests.jobs.atomic_record"
    reentry = {"lease_timeout": timedelta(seconds=2), "allow_stale_reentry": True}
    a = ScheduleFactory(
        name="a", job=job, interval=timedelta(seconds=1), start_at=start,
        overlap="concurrent", misfire="all", **reentry,
    )  # fmt: skip
    ScheduleFactory(name="b", job=job, interval=None, after=["a"], **reentry)
    first = children.start("--workers", "2")
    children.start("--workers", "2")
    ups = Execution.objects.filter(schedule="a")
    downs = Execution.objects.filter(schedule="b")
    wait_for(lambda: downs.count() >= 3, 60, "the first downstream rows")
    first.popen.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = ups.count()
    wait_for(lambda: ups.count() >= killed_at + 5, 60, "the upstream going on")
    Schedule.objects.filter(pk=a.pk).update(enabled=False)
    # Its runs in flight end (a killed one's lease expires and it runs again).
    wait_for(lambda: not Run.objects.filter(schedule=a).active().exists(), 60, "a's last runs")
    succeeded = set(ups.values_list("plan_time", flat=True))
    assert succeeded == set(
        Run.objects.filter(schedule=a, status="succeeded").values_list("plan_time", flat=True)
    )

    def caught_up() -> bool:
        return succeeded <= set(downs.values_list("plan_time", flat=True))

    wait_for(caught_up, 60, "a downstream row for every upstream success")
    planned = list(downs.values_list("plan_time", flat=True))
    assert len(planned) == len(set(planned)), "a plan time ran twice downstream"
    assert set(planned) == succeeded
    ups_rows = list(ups.values_list("plan_time", flat=True))
    assert len(ups_rows) == len(set(ups_rows))


@pytest.fixture
def fleet(postgres, transactional_db, tmp_path, seed):  # noqa: F811 (the fixture)
    """Two run_scheduler children with fast settings; all are reaped after the test."""
    fleet = crash.Fleet(2, ["--workers", "3"], crash.CHILD_SETTINGS, tmp_path, seed)
    yield from crash.reaped(fleet)


# D's wait bound; C's job for the plan times picked "late" takes LATE past it.
WAIT = timedelta(seconds=5)
LATE = 8.0
# Which plan times fail or are late, by their epoch second modulo EVERY (jobs.picked).
EVERY = 8
A_FAILS, C_FAILS, C_LATE = [1], [3], [5]
# A plan time whose upstreams' rows both committed this long before its wait bound must run.
ON_TIME = timedelta(seconds=1)


def execution_commits(schedule: str) -> dict[datetime, list[datetime]]:
    """When each of the schedule's Execution rows committed, by plan time: the server's own
    record (track_commit_timestamp), not a column the jobs or the scheduler write."""
    rows = Execution.objects.filter(schedule=schedule).values_list("pk", "plan_time")
    committed = crash.commit_times(Execution._meta.db_table)
    by_plan_time = defaultdict(list)
    for pk, plan_time in rows:
        by_plan_time[plan_time].append(committed[pk])
    return dict(by_plan_time)


@pytest.mark.crash
@pytest.mark.processes
def test_a_fan_in_runs_once_for_each_plan_time_both_upstreams_succeeded_for_under_kills(
    fleet, postgres
):
    """A and C every second, D after both (``after=["a", "c"]``), run by two run_scheduler
    processes one of which is SIGKILLed and restarted every 2-4 s. Every job is atomic: its
    Execution row commits with its run's success, so the rows are the successes. A fails
    for some plan times, C for others, and C takes past D's wait bound for others, each
    chosen by the plan time (jobs.picked). By the rows and when the server committed them:
    no plan time runs D twice; D runs only after both A and C succeeded for it, never where
    either failed; each plan time both succeeded for in good time has its D row; and a late
    C leaves D a skipped run naming it."""
    start = clock.now().replace(microsecond=0) + timedelta(seconds=4)
    reentry = {"lease_timeout": crash.LEASE_TIMEOUT, "allow_stale_reentry": True}
    every_second = {
        "job": "tests.jobs.atomic_by_plan_time", "interval": timedelta(seconds=1),
        "start_at": start, "overlap": "concurrent", "misfire": "all", **reentry,
    }  # fmt: skip
    picks = {"every": EVERY, "late_seconds": LATE}
    a = ScheduleFactory(name="a", kwargs={**picks, "fail_at": A_FAILS}, **every_second)
    c = ScheduleFactory(
        name="c", kwargs={**picks, "fail_at": C_FAILS, "late_at": C_LATE}, **every_second
    )
    d = ScheduleFactory(
        name="d", job="tests.jobs.atomic_record", interval=None, after=["a", "c"],
        after_wait=WAIT, **reentry,
    )  # fmt: skip
    fleet.start()
    crash.wait_until_registered(fleet)
    fleet.churn(time.monotonic() + 16)
    Schedule.objects.filter(pk__in=[a.pk, c.pk]).update(enabled=False)
    upstream_runs = Run.objects.filter(schedule__in=[a, c])
    wait_for(lambda: not upstream_runs.active().exists(), 40, "a's and c's last runs", poll=0.2)
    plan_times = set(upstream_runs.values_list("plan_time", flat=True))
    d_runs = Run.objects.filter(schedule=d)

    def decided() -> bool:
        recorded = set(d_runs.values_list("plan_time", flat=True))
        return plan_times <= recorded and not d_runs.active().exists()

    wait_for(decided, 30, "d to decide every plan time and run what it decided", poll=0.2)
    fleet.stop()
    assert len(fleet.pid_set("kill")) >= 2, fleet.logs()

    ups, cs, ds = execution_commits("a"), execution_commits("c"), execution_commits("d")
    for name, rows in {"a": ups, "c": cs, "d": ds}.items():
        twice = sorted(plan_time for plan_time, commits in rows.items() if len(commits) > 1)
        assert not twice, f"{name} ran twice for {twice}"
    both = set(ups) & set(cs)
    assert set(ds) <= both, f"d ran without both upstreams' success for {set(ds) - both}"
    for plan_time, (d_commit,) in ds.items():
        assert d_commit > max(ups[plan_time][0], cs[plan_time][0]), f"d ran early for {plan_time}"

    def in_time(rows: dict, plan_time: datetime) -> bool:
        return plan_time in rows and rows[plan_time][0] < plan_time + WAIT - ON_TIME

    fates = {run.plan_time: run for run in d_runs}

    def skipped_naming(plan_time: datetime, codes: set[str], upstream: str) -> bool:
        """D's run for it is skipped with one of ``codes``, naming ``upstream``; or, if A
        was not done in time either (its run killed and run again), naming A."""
        run = fates[plan_time]
        names = {upstream} if in_time(ups, plan_time) else {upstream, "a"}
        said = {name for name in names if f"{name!r}" in run.error_message}
        return run.status == "skipped" and run.error_code in codes and bool(said)

    def shown(times) -> list:
        return [(t, fates[t].status, fates[t].error_code, fates[t].error_message) for t in times]

    # The plan times each rule picked, of those both upstreams have a run for (the last
    # ones may have only one: they were turned off between the two fires).
    both_ran = set.intersection(
        *(set(upstream_runs.filter(schedule=s).values_list("plan_time", flat=True)) for s in (a, c))
    )
    chosen = {
        rule: sorted(t for t in both_ran if picked(t, EVERY, at))
        for rule, at in {"a fails": A_FAILS, "c fails": C_FAILS, "c late": C_LATE}.items()
    }
    assert all(chosen.values()), chosen
    ended = {ErrorCode.UPSTREAM_FAILED, ErrorCode.UPSTREAM_LATE}  # late: it failed late
    assert not set(chosen["a fails"]) & set(ups) and not set(chosen["c fails"]) & set(cs)
    for rule, upstream in (("a fails", "a"), ("c fails", "c")):
        failed = chosen[rule]
        assert all(skipped_naming(t, ended, upstream) for t in failed), shown(failed)
    late = chosen["c late"]
    assert set(late) <= set(cs) and not set(late) & set(ds)
    assert all(skipped_naming(t, {ErrorCode.UPSTREAM_LATE}, "c") for t in late), shown(late)
    # Both succeeded in good time: exactly one D row. Nearer the bound (a killed upstream's
    # run that ran again), D ran once or was skipped as late.
    on_time = {t for t in both if in_time(ups, t) and in_time(cs, t)}
    assert len(on_time) >= 5, sorted(on_time)
    assert on_time <= set(ds), f"no d row for {shown(sorted(on_time - set(ds)))}"
    not_run = sorted(both - set(ds))
    late_codes = {ErrorCode.UPSTREAM_LATE}
    assert all(skipped_naming(t, late_codes, "c") for t in not_run), shown(not_run)
    counts = {"d rows": len(ds), "both in time": len(on_time), "d skipped late": len(not_run)}
    print(crash.report("a and c, then d", fleet, {**counts, "c late": len(late)}, start))


# -- explain ---------------------------------------------------------------------------------


def test_explain_says_what_a_downstream_ran_after_waits_for_and_why_it_skipped():
    a, c = upstream("a"), upstream("c")
    d = downstream("d", ["a", "c"], after_wait=timedelta(minutes=30))
    ran(a, T1, "succeeded")
    ran(c, T1, "succeeded")
    ran(a, T2, "succeeded")
    ran(a, T3, "succeeded")
    plan_after(T3 + timedelta(minutes=1))
    (t1, t2, t3) = d.explain(T1, T3 + timedelta(hours=1))
    assert (t1.status, t1.detail) == (
        "pending",
        "It ran after its upstreams' runs for this plan time.",
    )
    assert (t2.status, t2.code) == ("skipped", ErrorCode.UPSTREAM_LATE)
    assert "'c' was not done within 30 minutes" in t2.detail
    assert (t3.status, t3.run_id) == ("not_planned_yet", None)
    assert t3.detail.startswith("Waits for 'c', until ")


def test_the_preview_and_fire_diff_say_a_downstream_has_no_clock():
    from django_periodic.admin.preview import preview

    upstream("a")
    b = downstream("b", ["a"])
    shown = preview(b, clock.now())
    assert (shown.description, shown.fires) == (
        "After a: once for each plan time they ran for", [],
    )  # fmt: skip
    diff = b.fire_diff(days=1, after=[], cron="0 * * * *")
    assert len(diff.added) == 24 and not diff.removed
    assert not b.fire_diff(days=1, after=["a", "b"])  # no clock either way


def test_a_downstream_stored_without_save_gets_no_cursor_from_reschedule():
    upstream("a")
    (b,) = Schedule.objects.bulk_create([Schedule(name="b", job="tests.jobs.noop", after=["a"])])
    assert Schedule.objects.get(pk=b.pk).is_unplanned
    Schedule.objects.filter(pk=b.pk).reschedule()
    assert Schedule.objects.get(pk=b.pk).next_fire_at is None


def test_explain_page_reads_a_downstream_a_page_at_a_time(monkeypatch):
    from django_periodic.models.explaining import explain

    monkeypatch.setattr(explain, "PAGE_SIZE", 2)
    a = upstream("a")
    b = downstream("b", ["a"])
    for plan_time in (T1, T2, T3):
        ran(a, plan_time, "succeeded")
    plan_after(T3 + timedelta(minutes=1))
    first = b.explain_page(T1, T3 + timedelta(hours=1))
    assert [account.plan_time for account in first.accounts] == [T1, T2]
    assert first.next_after == T2
    rest = b.explain_page(T1, T3 + timedelta(hours=1), after=first.next_after)
    assert ([account.plan_time for account in rest.accounts], rest.next_after) == ([T3], None)


def test_a_pass_that_fails_leaves_the_tick_and_its_heartbeat_standing(monkeypatch):
    from django_periodic.engine.loop.scheduler import Scheduler
    from django_periodic.engine.planning import after
    from django_periodic.models import SchedulerProcess

    def broken(now, using="default"):
        Schedule.objects.update(last_error="written, then undone")
        raise RuntimeError("a bug")

    scheduler = Scheduler(workers=0)
    scheduler.boot()
    upstream("a")
    monkeypatch.setattr(after, "plan_after", broken)
    beat = SchedulerProcess.objects.get(pk=scheduler.process.pk).heartbeat_at
    scheduler.housekeeper.next_heartbeat = clock.now()
    scheduler.tick()
    assert SchedulerProcess.objects.get(pk=scheduler.process.pk).heartbeat_at > beat
    assert not Schedule.objects.exclude(last_error="").exists()  # its savepoint rolled back
