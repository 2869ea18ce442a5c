import pytest

from django_periodic import executor, leases
from django_periodic.models import Run
from tests.factories import RunFactory, ScheduleFactory


def claimed(process, now, **schedule_fields) -> leases.Claim:
    RunFactory(schedule=ScheduleFactory(**schedule_fields), plan_time=now)
    (claim,) = leases.claim(process, now, 1)
    return claim


@pytest.mark.django_db
def test_a_job_runs_with_its_arguments_and_its_result_is_kept(process, now):
    claim = claimed(process, now, job="tests.jobs.add", args=[2], kwargs={"b": 3})
    assert executor.execute(claim) == "succeeded"
    assert Run.objects.get().result == 5


@pytest.mark.django_db
def test_an_exception_fails_the_run_with_code_message_and_traceback(process, now):
    claim = claimed(process, now, job="tests.jobs.explode", kwargs={"message": "kaput"})
    assert executor.execute(claim) == "failed"
    run = Run.objects.get()
    assert (run.error_code, run.error_message) == ("RuntimeError", "kaput")
    assert "raise RuntimeError(message)" in run.traceback


@pytest.mark.django_db
def test_an_exception_with_attempts_left_retries(process, now):
    claim = claimed(process, now, job="tests.jobs.explode", max_attempts=2)
    assert executor.execute(claim) == "retrying"


@pytest.mark.django_db
def test_a_job_that_is_no_longer_registered_fails_without_retry(process, now):
    claim = claimed(process, now, max_attempts=3)
    Run.objects.update(job_name="tests.jobs.gone")
    claim.run.job_name = "tests.jobs.gone"
    assert executor.execute(claim) == "failed"
    assert Run.objects.get().error_code == "unknown_job"


@pytest.mark.django_db
def test_a_job_taking_context_sees_its_run_and_can_heartbeat(process, now):
    claim = claimed(process, now, job="tests.jobs.report_context")
    executor.execute(claim)
    result = Run.objects.get().result
    assert result["run"] == claim.run.pk
    assert result["attempt"] == 1
    assert result["heartbeat"] is True
    assert result["cancelled"] is False


@pytest.mark.django_db
def test_heartbeat_after_losing_the_lease_cancels_the_job(process, now):
    claim = claimed(process, now)
    leases.release(claim, now)
    context = executor.JobContext(claim.run, now, 1, claim)
    assert context.heartbeat() is False
    assert context.cancelled


def test_results_that_are_too_big_or_not_json_are_stored_safely(settings):
    settings.DJANGO_PERIODIC = {"RESULT_MAX_BYTES": 20}
    assert executor.capped_result({"a": 1}) == {"a": 1}
    big = executor.capped_result("x" * 100)
    assert big["preview"] == '"' + "x" * 19
    assert "truncated" in big["note"]
    odd = executor.capped_result(object())
    assert odd["repr"].startswith("<object object")
