"""What must not leak: the names of schedules to whoever can reach the health view, and
the row values PostgreSQL quotes in its errors (a job's arguments) to stored errors and
logs (error_texts.py)."""

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import IntegrityError, connection, transaction

from django_periodic import job
from django_periodic.engine.planning import planner
from django_periodic.engine.runs import claims
from django_periodic.error_texts import error_text
from django_periodic.models import Run, Schedule
from tests import ledger
from tests.factories import RunFactory, ScheduleFactory

SECRET = "hunter2"
NAME = "payroll-acme-corp"


def needing_attention(now) -> Schedule:
    schedule = ScheduleFactory(name=NAME, alert_failures=3)
    Schedule.objects.filter(pk=schedule.pk).update(attention_reason="failing", attention_since=now)
    return schedule


def staff_user(django_user_model, *permissions: str):
    user = django_user_model.objects.create_user("ops", password="-", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_periodic", codename__in=permissions
        )
    )
    return user


# -- the health view -------------------------------------------------------------------------


def test_the_anonymous_health_view_counts_the_schedules_needing_attention(client, now):
    needing_attention(now)
    response = client.get("/periodic/health/")
    assert response.status_code == 503
    assert response.json()["problems"] == [
        {"check": "schedules_need_attention", "message": "1 schedule(s) need attention"}
    ]
    assert NAME not in response.text


def test_a_user_allowed_to_view_schedules_gets_their_names(client, now, django_user_model):
    needing_attention(now)
    client.force_login(staff_user(django_user_model, "view_schedule"))
    (problem,) = client.get("/periodic/health/").json()["problems"]
    assert problem["message"] == f"schedule(s) need attention: {NAME}"


def test_a_signed_in_user_without_the_permission_gets_counts(client, now, django_user_model):
    needing_attention(now)
    client.force_login(staff_user(django_user_model, "view_run"))
    assert NAME not in client.get("/periodic/health/").text


def test_the_django_health_check_check_names_no_schedule(client, now):
    needing_attention(now)
    response = client.get("/ht/?format=json")
    assert response.status_code == 500
    assert "1 schedule(s) need attention" in response.text and NAME not in response.text


# -- row values in database errors -----------------------------------------------------------


@pytest.fixture
def refusing_secrets(postgres):
    """The run table refuses a run whose arguments hold SECRET, with PostgreSQL's CHECK
    violation, whose DETAIL quotes the whole row (rolled back with the test)."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT no_secret"
            f" CHECK (strpos(kwargs::text, '{SECRET}') = 0)"
        )


def refused_run() -> IntegrityError:
    schedule = ScheduleFactory(kwargs={"password": SECRET})
    try:
        with transaction.atomic():
            RunFactory(schedule=schedule)
    except IntegrityError as exc:
        assert SECRET in str(exc)  # what we must not store or log
        return exc
    raise AssertionError("the run was not refused")


def test_an_integrity_errors_text_is_its_message_without_the_row(refusing_secrets):
    text = error_text(refused_run())
    assert 'violates check constraint "no_secret"' in text
    assert SECRET not in text and "DETAIL" not in text


def test_a_logged_integrity_error_carries_no_row_values(refusing_secrets, caplog):
    logger = logging.getLogger("django_periodic")
    exc = refused_run()
    try:
        raise RuntimeError("while planning") from exc
    except RuntimeError:
        logger.exception("Planning a batch failed.")
    logger.error("The database refused it (%s).", exc)
    assert 'violates check constraint "no_secret"' in caplog.text
    assert "Traceback" in caplog.text and "while planning" in caplog.text
    assert SECRET not in caplog.text and "DETAIL" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_a_job_failing_with_an_integrity_error_stores_no_row_values(
    refusing_secrets, process, now, clean_registry
):
    @job(name="tests.leaky")
    def leaky():
        raise refused_run()

    RunFactory(schedule=ScheduleFactory(job="tests.leaky"), plan_time=now)
    (claim,) = claims.claim(process, now, 1)
    assert ledger.execute(claim) == "failed"
    run = Run.objects.get(schedule__job="tests.leaky")
    assert run.error_code == "IntegrityError"
    assert 'violates check constraint "no_secret"' in run.error_message
    assert "raise refused_run()" in run.traceback and "no_secret" in run.traceback
    assert SECRET not in run.error_message + run.traceback


def test_a_schedule_whose_run_the_database_refuses_stores_no_row_values(refusing_secrets, caplog):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    healthy = ScheduleFactory(interval=timedelta(seconds=10), start_at=t0)
    bad = ScheduleFactory(interval=timedelta(seconds=10), start_at=t0, kwargs={"pin": SECRET})
    Schedule.objects.update(next_fire_at=t0)
    result = planner.plan_due(t0)
    assert (result.fired, result.failed) == (1, [bad.name])
    assert Run.objects.filter(schedule=healthy, plan_time=t0).exists()
    bad.refresh_from_db()
    assert 'violates check constraint "no_secret"' in bad.last_error
    assert SECRET not in bad.last_error and "DETAIL" not in bad.last_error
    assert "no_secret" in caplog.text and SECRET not in caplog.text
