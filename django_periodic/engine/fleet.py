"""Mixed releases: which jobs the live processes have, and what a process does with a job
it does not have.

During a rolling deploy, processes of two releases share the ledger, and a job that only
the new release has is unknown to the old one. Each ``run_scheduler`` process states the
jobs its code registers (``SchedulerProcess.jobs``), and then:

- planning needs the trigger, not the code: every process plans every schedule;
- a process claims only runs whose job it has (``local_jobs``, in the claim and the look
  ahead);
- a waiting run of a job that no live process has ends ``skipped`` (``job_not_deployed``)
  at its start deadline, or ``UNKNOWN_JOB_GRACE`` after it was due if it has none;
- a schedule is disabled for its job only once no live process has had the job for
  ``UNKNOWN_JOB_GRACE`` (``Schedule.job_unknown_since`` notes since when).

A process of a release before this one states nothing (``jobs`` is NULL): it may have any
job, so while one lives nothing is skipped or disabled for its job.
"""

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce

from django_periodic import registry, signals
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.conf import get_settings
from django_periodic.engine.overlap import announce_ended
from django_periodic.engine.records import Due
from django_periodic.models import Run, Schedule, SchedulerProcess
from django_periodic.models.run import CLAIMABLE_STATUSES, RELEASE, past_start_deadline_filter

logger = logging.getLogger("django_periodic")

NOT_DEPLOYED_MESSAGE = "No live process has its job {job!r}: it could not start in time."


def local_jobs() -> tuple[str, ...]:
    """The names of the jobs this process's code registers."""
    return tuple(registry.registered_jobs())


def fleet_jobs(now: datetime, using: str) -> frozenset[str] | None:
    """The jobs some live process has (this one's included); None if a live process does
    not say which it has (a release before this one): then it may have any."""
    stated = SchedulerProcess.objects.using(using).alive(now).values_list("jobs", flat=True)
    known = set(local_jobs())
    for jobs in stated:
        if not isinstance(jobs, list):
            # NULL, or a value no release writes (stored by hand): as a process that
            # does not say, it may have any job.
            return None
        known.update(str(job) for job in jobs)
    return frozenset(known)


def judge_jobs(schedules: list[Due], now: datetime, using: str) -> list[Due]:
    """Note which due schedules' jobs no live process has, and disable those whose job none
    has had for ``UNKNOWN_JOB_GRACE``; return those disabled, which are not to be planned.

    The schedules' rows are locked by the caller's transaction. Costs nothing while every
    due schedule's job is this process's, and one query more when one is not.
    """
    local = set(local_jobs())
    foreign = {s.job for s in schedules} - local
    known = fleet_jobs(now, using) if foreign else frozenset(local)
    unknown = [s for s in schedules if known is not None and s.job not in known]
    unknown_pks = {s.pk for s in unknown}
    found_again = [s.pk for s in schedules if s.job_unknown_since and s.pk not in unknown_pks]
    grace = get_settings().UNKNOWN_JOB_GRACE
    disabled = [s for s in unknown if now - (s.job_unknown_since or now) >= grace]
    # A grace of 0 disables at first sight: nothing to note then.
    first_seen = [s.pk for s in unknown if s.job_unknown_since is None and s not in disabled]
    rows = Schedule.objects.using(using)
    if found_again:
        rows.filter(pk__in=found_again).update(job_unknown_since=None)
    if first_seen:
        rows.filter(pk__in=first_seen).update(job_unknown_since=now)
    for schedule in disabled:
        _disable(schedule, grace_error(schedule.job), using)
    return disabled


def grace_error(job: str) -> str:
    """The ``last_error`` of a schedule disabled because no live process has its job."""
    grace = get_settings().UNKNOWN_JOB_GRACE
    return (
        f"Disabled: no live process has had its job {job!r} for {grace} "
        "(UNKNOWN_JOB_GRACE). Deploy code that registers it, or change the schedule's job, "
        "then enable it."
    )


def _disable(schedule: Due, error: str, using: str) -> None:
    logger.error("Disabled schedule %r: %s", schedule.name, error)
    Schedule.objects.using(using).filter(pk=schedule.pk).update(
        enabled=False, last_error=error, job_unknown_since=None
    )


def skip_undeployed(now: datetime, using: str) -> list[int]:
    """Skip the waiting runs (executed by ``run_scheduler``) of jobs that no live process has,
    once past their start deadline, or ``UNKNOWN_JOB_GRACE`` after they were due if they have
    none; return their schedules (whose queued runs may move up). Two queries while nothing
    waits for an unknown job."""
    known = fleet_jobs(now, using)
    if known is None:
        return []
    grace = get_settings().UNKNOWN_JOB_GRACE
    # Pending or retrying, at any attempt: the start deadline's comparison is the one that
    # skips a first start too late (models/run.py), the grace is fleet's own.
    too_late = past_start_deadline_filter(now) | Q(waited_since__lt=now - grace)
    waiting = (
        Run.objects.using(using)
        .executed_here()
        .filter(status__in=CLAIMABLE_STATUSES)
        .exclude(job_name__in=known)
        .alias(waited_since=Coalesce("next_retry_at", RELEASE))
        .filter(too_late)
    )
    with transaction.atomic(using=using):
        locked = waiting.select_for_update(skip_locked=True)
        rows = list(locked.values_list("pk", "schedule_id", "job_name"))
        for job in {job for _, _, job in rows}:
            Run.objects.using(using).filter(pk__in=[pk for pk, _, of in rows if of == job]).update(
                status=RunStatus.SKIPPED,
                error_code=ErrorCode.JOB_NOT_DEPLOYED,
                error_message=NOT_DEPLOYED_MESSAGE.format(job=job),
                next_retry_at=None,
                enqueued_at=None,
                finished_at=now,
            )
        announce_ended([pk for pk, _, _ in rows], signals.run_skipped, using)
    if rows:
        logger.warning("Skipped %d runs whose job no live process has.", len(rows))
    return [schedule_id for _, schedule_id, _ in rows]
