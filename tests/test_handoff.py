"""Handing runs to a django.tasks backend: dispatch by the scheduler, execution by the task.

Django's DummyBackend keeps what was enqueued, so these tests deliver its tasks themselves
(``deliver``), once or twice, late or never; ImmediateBackend runs a task as it is enqueued.
End-to-end tests with django-tasks-db's db_worker processes are in test_handoff_workers.py.
"""

import sys
import threading
from dataclasses import replace
from datetime import timedelta
from typing import ClassVar

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import connection, connections, transaction
from django.urls import reverse
from django.utils.module_loading import import_string
from django_tasks_db.models import DBTaskResult

from django_periodic import checks, taskbackends, tasks
from django_periodic.engine.loop.scheduler import Scheduler
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims, handoff, leases
from django_periodic.models import Lease, Run, Schedule
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import set_cursor
from tests.models import Execution
from tests.processes import wait_for
from tests.threads import Thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pgbouncer]


@pytest.fixture
def dummy():
    """The DummyBackend of the "dummy" alias, emptied before and after."""
    backend = taskbackends.framework().task_backends["dummy"]
    backend.clear()
    yield backend
    backend.clear()


def deliver(result) -> str:
    """What a backend's worker does with an enqueued task: call it with its arguments."""
    return result.task.call(*result.args, **result.kwargs)


def handed_off(now, job="tests.jobs.record", backend="dummy", **fields) -> Run:
    schedule = ScheduleFactory(job=job, tasks_backend=backend, **fields)
    return RunFactory(schedule=schedule, plan_time=now, tasks_backend=backend)


def test_a_schedule_routed_to_a_backend_plans_runs_routed_there(now, settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "dummy"}
    routed = ScheduleFactory(tasks_backend="default")
    default = ScheduleFactory()
    assert routed.run_now().tasks_backend == "default"
    assert default.run_now().tasks_backend == "dummy"
    settings.DJANGO_PERIODIC = {}
    assert ScheduleFactory().run_now().tasks_backend == ""


def test_planned_runs_take_the_route_of_their_schedule(now, settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "dummy"}
    ScheduleFactory(name="routed", interval=timedelta(seconds=1), tasks_backend="default")
    ScheduleFactory(name="by-setting", interval=timedelta(seconds=1))
    Schedule.objects.update(next_fire_at=now)
    planner.plan_due(now)
    routes = dict(Run.objects.values_list("schedule__name", "tasks_backend"))
    assert routes == {"routed": "default", "by-setting": "dummy"}


def test_our_workers_never_claim_a_handed_off_run(now, process):
    handed_off(now)
    assert claims.claim(process, now, 10) == []
    assert claims.claim(process, now, 10, ahead=timedelta(seconds=5)) == []


def test_dispatch_enqueues_one_task_per_run_that_may_start(now, dummy):
    due = handed_off(now)
    handed_off(now + timedelta(hours=1))  # not yet
    RunFactory(plan_time=now)  # ours
    assert handoff.dispatch() == 1
    (result,) = dummy.results
    assert result.args == [due.pk, "default"]
    due.refresh_from_db()
    assert (due.status, due.task_id) == ("pending", result.id)
    assert due.enqueued_at is not None
    assert handoff.dispatch() == 0  # its task is waiting: not enqueued again


def test_a_task_runs_its_job_once_however_often_it_is_delivered(now, dummy):
    run = handed_off(now)
    handoff.dispatch()
    (result,) = dummy.results
    assert deliver(result) == "succeeded"
    assert deliver(result) == tasks.NOT_CLAIMED
    run.refresh_from_db()
    assert (run.status, run.attempt, run.enqueued_at) == ("succeeded", 1, None)
    assert Execution.objects.count() == 1
    (lease,) = Lease.objects.all()
    assert lease.process is None and lease.holder.endswith("(task)")
    assert lease.outcome == "succeeded"


def test_a_failed_attempt_is_retried_through_a_new_task(now, dummy):
    run = handed_off(now, job="tests.jobs.explode", max_attempts=2)
    handoff.dispatch()
    assert deliver(dummy.results[0]) == "retrying"
    assert handoff.dispatch() == 0  # its retry is not due yet
    Run.objects.filter(pk=run.pk).update(next_retry_at=now)
    assert handoff.dispatch() == 1
    assert deliver(dummy.results[1]) == "failed"
    run.refresh_from_db()
    assert (run.status, run.attempt, run.error_code) == ("failed", 2, "RuntimeError")


def test_a_lost_task_is_enqueued_again_after_the_pickup_timeout(now, dummy, settings):
    run = handed_off(now)
    handoff.dispatch()
    dummy.clear()  # the backend lost it
    assert handoff.dispatch() == 0  # within the pickup timeout: presumed on its way
    timeout = settings.DJANGO_PERIODIC.get("TASKS_PICKUP_TIMEOUT", 300)
    Run.objects.filter(pk=run.pk).update(enqueued_at=now - timedelta(seconds=timeout + 1))
    assert handoff.dispatch() == 1
    assert deliver(dummy.results[0]) == "succeeded"


def test_a_task_still_queued_past_the_pickup_timeout_is_not_enqueued_twice(now):
    # django-tasks-db's backend can say whether a task still waits (DummyBackend cannot).
    run = handed_off(now, backend="database")
    handoff.dispatch()
    long_ago = now - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(enqueued_at=long_ago)
    assert handoff.dispatch() == 0  # the backend says it waits in its queue
    assert DBTaskResult.objects.count() == 1
    run.refresh_from_db()
    assert run.enqueued_at > long_ago  # looked at again only after another timeout
    DBTaskResult.objects.all().delete()  # now it is lost
    Run.objects.filter(pk=run.pk).update(enqueued_at=long_ago)
    assert handoff.dispatch() == 1


def test_a_task_said_to_wait_for_three_pickup_timeouts_is_enqueued_again(now, settings):
    # Celery says a task it lost (its worker killed after taking it) waits, for ever: the
    # backend's word is good for three pickup timeouts from when it took the task.
    run = handed_off(now, backend="database")
    handoff.dispatch()
    timeout = timedelta(seconds=settings.DJANGO_PERIODIC.get("TASKS_PICKUP_TIMEOUT", 300))
    long_ago = now - 3 * timeout
    DBTaskResult.objects.update(enqueued_at=long_ago)
    Run.objects.filter(pk=run.pk).update(enqueued_at=long_ago)
    assert handoff.dispatch() == 1
    assert DBTaskResult.objects.count() == 2  # the first, if it ever comes, claims nothing


def test_a_run_routed_to_an_unknown_alias_fails_and_the_others_are_enqueued(now, dummy):
    # clean() refuses the alias; update() and raw SQL store it all the same.
    lost = handed_off(now, backend="no-such-alias")
    queued = RunFactory(
        schedule=lost.schedule, plan_time=now + timedelta(seconds=1), status="queued"
    )
    due = handed_off(now)
    assert handoff.dispatch() == 1
    (result,) = dummy.results
    assert result.args == [due.pk, "default"]
    lost.refresh_from_db()
    assert (lost.status, lost.error_code) == ("failed", "unknown_tasks_backend")
    assert "'no-such-alias' is not a backend of the TASKS setting" in lost.error_message
    assert lost.finished_at is not None
    queued.refresh_from_db()
    assert queued.status == "pending"  # the failed run's slot is free: the queue moves up
    assert handoff.dispatch() == 0  # nothing left to hand off, nothing failed twice


def test_a_task_that_cannot_be_enqueued_is_left_for_the_pickup_timeout(now, settings):
    # A backend that refuses the task (here: a queue it does not have) is a backend's
    # trouble, maybe passing: the run stays pending, and the rest of the batch is sent.
    refused = handed_off(now)
    Run.objects.filter(pk=refused.pk).update(tasks_backend="database")
    due = handed_off(now)
    database = {**settings.TASKS["database"], "QUEUES": ["other"]}
    settings.TASKS = {**settings.TASKS, "database": database}
    assert handoff.dispatch() == 1
    refused.refresh_from_db()
    assert (refused.status, refused.task_id) == ("pending", "")
    assert refused.enqueued_at is not None  # tried again once the pickup timeout passed
    due.refresh_from_db()
    assert due.task_id  # enqueued (to a new DummyBackend: changing TASKS made new ones)


class NoIdBackend(import_string(django_settings.TASKS["dummy"]["BACKEND"])):
    """A DummyBackend that gives the tasks of the runs in ``no_id_for`` no id."""

    no_id_for: ClassVar[set[int]] = set()

    def enqueue(self, task, args, kwargs):
        result = super().enqueue(task, args, kwargs)
        return replace(result, id=None) if args[0] in self.no_id_for else result


def test_a_task_id_the_database_refuses_is_not_noted_and_the_others_are(now, settings):
    # One id refused (NULL) failed the batch's single UPDATE, out of the dispatcher.
    settings.TASKS = {**settings.TASKS, "dummy": {"BACKEND": f"{__name__}.NoIdBackend"}}
    runs = [handed_off(now) for _ in range(3)]
    NoIdBackend.no_id_for = {runs[1].pk}
    assert handoff.dispatch() == 3
    task_ids = [Run.objects.get(pk=run.pk).task_id for run in runs]
    assert task_ids[0] and task_ids[2] and task_ids[1] == ""


def test_a_task_picked_up_past_the_start_deadline_skips_its_run(now, dummy):
    run = handed_off(now, job="tests.jobs.record")
    Run.objects.filter(pk=run.pk).update(start_deadline=now - timedelta(seconds=1))
    handoff.dispatch()
    assert deliver(dummy.results[0]) == tasks.NOT_CLAIMED
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("skipped", "start_deadline")
    assert not Execution.objects.exists()


def test_a_cancelled_run_is_not_run_by_its_task(now, dummy):
    run = handed_off(now)
    handoff.dispatch()
    leases.request_cancel(Run.objects.filter(pk=run.pk), now)
    assert deliver(dummy.results[0]) == tasks.NOT_CLAIMED
    assert not Execution.objects.exists()


def executing(run: Run) -> tuple[threading.Thread, list[str]]:
    """Deliver the run's task on a thread of its own, as a worker would; wait until its job
    has started."""
    thread, returned = delivering(run)
    wait_for(Execution.objects.exists, 10, "the job to start")
    return thread, returned


def delivering(run: Run) -> tuple[threading.Thread, list[str]]:
    """Deliver the run's task on a thread of its own, as a worker would."""
    returned: list[str] = []

    def work() -> None:
        try:
            returned.append(tasks.execute(run.pk))
        finally:
            connections.close_all()  # the worker thread's own

    thread = Thread(target=work)
    thread.start()
    return thread, returned


def test_a_task_waits_for_its_run_while_its_dispatcher_holds_the_row(now, postgres):
    # The dispatcher notes the task's id while the task may already be on a worker: the
    # task must claim the run once that commits, not find it locked and skip it.
    run = handed_off(now)
    with transaction.atomic():
        Run.objects.select_for_update().get(pk=run.pk)
        thread, returned = delivering(run)
        wait_for(waiting_for_a_lock, 10, "the task to wait for the row")
    thread.join(30)
    assert returned == ["succeeded"]


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        # In a transaction, pg_stat_activity is read once unless its snapshot is cleared.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@pytest.fixture
def fast_heartbeat(settings):
    settings.DJANGO_PERIODIC = {"HEARTBEAT_INTERVAL": 0.1, "TIMEOUT_GRACE": 0.5}


def test_a_task_passes_a_cancel_request_on_to_its_running_job(now, fast_heartbeat):
    run = handed_off(now, job="tests.jobs.linger", kwargs={"seconds": 60})
    thread, returned = executing(run)
    leases.request_cancel(Run.objects.filter(pk=run.pk), now)
    thread.join(30)
    assert returned == ["cancelled"]
    run.refresh_from_db()
    assert (run.status, run.result) == ("cancelled", None)


def test_a_task_stops_its_job_at_the_timeout(now, fast_heartbeat):
    run = handed_off(
        now, job="tests.jobs.linger", kwargs={"seconds": 60}, timeout=timedelta(seconds=0.3)
    )
    thread, returned = executing(run)
    thread.join(30)
    assert returned == ["failed"]
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "timeout")


def test_a_task_whose_job_ignores_its_timeout_fails_it_after_the_grace(now, fast_heartbeat):
    run = handed_off(
        now,
        job="tests.jobs.linger",
        kwargs={"seconds": 3, "cooperative": False},
        timeout=timedelta(seconds=0.3),
    )
    thread, returned = executing(run)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 10, "the timeout")
    thread.join(30)
    assert returned == [tasks.NOT_RECORDED]  # its late end changed nothing
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "timeout")
    assert Lease.objects.get().outcome == "timeout"


def test_a_task_that_lost_its_lease_records_nothing(now, fast_heartbeat):
    run = handed_off(now, job="tests.jobs.linger", kwargs={"seconds": 60})
    thread, returned = executing(run)
    Lease.objects.update(expires_at=now - timedelta(seconds=1))
    assert leases.sweep(now + timedelta(seconds=1)).failed == 1  # as if its worker died
    thread.join(30)
    assert returned == [tasks.NOT_RECORDED]
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "lease_expired")


def test_the_scheduler_hands_due_runs_to_the_immediate_backend(now, settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "default"}  # ImmediateBackend
    ScheduleFactory(job="tests.jobs.record", interval=None, run_at=now)
    Scheduler(workers=0).run(once=True)
    run = Run.objects.get()
    assert (run.status, run.tasks_backend) == ("succeeded", "default")
    assert Lease.objects.get().holder.endswith("(task)")


def test_a_schedule_names_a_backend_of_the_tasks_setting(now):
    schedule = ScheduleFactory.build(tasks_backend="nowhere")
    with pytest.raises(ValidationError) as raised:
        schedule.full_clean()
    assert "'nowhere' is not a backend of the TASKS setting" in str(raised.value)
    ScheduleFactory.build(tasks_backend="dummy").full_clean()


def test_checks_name_an_unknown_backend(settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "nowhere"}
    (error,) = checks.check_tasks_backend()
    assert error.id == "django_periodic.E005"
    assert "'nowhere' is not a backend" in error.msg
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "dummy"}
    assert checks.check_tasks_backend() == []


def test_checks_say_what_to_install_without_a_tasks_framework(settings, monkeypatch):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "default"}
    # As on Django 5.2 without the backport: neither module can be imported.
    monkeypatch.setitem(sys.modules, "django.tasks", None)
    monkeypatch.setitem(sys.modules, "django_tasks", None)
    (error,) = checks.check_tasks_backend()
    assert "pip install 'django-periodic[tasks]'" in error.msg


def test_checks_reject_a_tasks_backend_that_is_not_a_string(settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": 3}
    (error,) = checks.check_settings()
    assert error.id == "django_periodic.E003"
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": None, "TASKS_QUEUE": "periodic"}
    assert checks.check_settings() == []


def test_the_schedule_form_offers_the_tasks_backends(admin_client, settings):
    settings.DJANGO_PERIODIC = {"TASKS_BACKEND": "dummy"}
    schedule = ScheduleFactory(tasks_backend="database")
    url = reverse("admin:django_periodic_schedule_change", args=[schedule.pk])
    html = admin_client.get(url).content.decode()
    assert '<option value="">Default (dummy)</option>' in html
    assert '<option value="database" selected>database</option>' in html
    assert '<option value="default">default</option>' in html


def test_the_run_page_shows_where_the_run_was_handed(admin_client, now, dummy):
    run = handed_off(now)
    handoff.dispatch()
    run.refresh_from_db()
    html = admin_client.get(reverse("admin:django_periodic_run_change", args=[run.pk]))
    text = html.content.decode()
    assert "Handed to a tasks backend" in text and run.task_id in text


def test_a_fanned_out_fire_hands_each_scope_its_own_task(now, dummy):
    schedule = ScheduleFactory(
        job="tests.jobs.per_tenant", scopes="tests.regions", tasks_backend="dummy"
    )
    set_cursor(schedule, now)
    planner.plan_due(now)
    assert handoff.dispatch() == 2
    assert sorted(deliver(result) for result in dummy.results) == ["succeeded", "succeeded"]
    results = dict(Run.objects.values_list("scope", "result"))
    assert results == {"eu": "hello eu", "us": "hello us"}


def test_a_broken_tasks_backend_is_logged_and_the_others_still_get_the_task(settings, caplog):
    # django_periodic.tasks builds the task for each backend as it is imported: a backend
    # that cannot even load fails its own runs (unknown or unenqueued), not that import.
    from django_periodic import tasks

    settings.TASKS = {**settings.TASKS, "broken": {"BACKEND": "no.such.Backend"}}
    tasks._register_with_every_backend()
    assert "Could not build the task for tasks backend 'broken'" in caplog.text
    assert tasks.execute_run_on("database").backend == "database"
