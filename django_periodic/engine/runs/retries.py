"""Retries: whether a failed attempt is tried again, and when (exponential backoff with
jitter); and a failed run retried by hand, as a new run (trigger ``retry``).

An attempt cut short by its process stopping (an interruption) counts as no attempt.
"""

import random
from datetime import datetime, timedelta

from django_periodic import registry
from django_periodic.models import Run

MAX_RETRY_DELAY = timedelta(days=1)


def retry_in(run: Run, retryable: bool) -> timedelta | None:
    """How long until a failed attempt of ``run`` is tried again; None: the run fails
    (its failure is not ``retryable``, or its attempts are used up)."""
    attempts_used = run.attempt - run.interruptions
    if not retryable or attempts_used >= run.max_attempts:
        return None
    return retry_delay(run.schedule.retry_backoff, attempts_used)


def retry_delay(backoff: timedelta, attempts_used: int) -> timedelta:
    """Exponential backoff with jitter: about backoff, 2x, 4x... each between 50% and 100%."""
    exponent = min(attempts_used - 1, 30)
    delay: timedelta = min(backoff * (2**exponent), MAX_RETRY_DELAY)
    return delay * random.uniform(0.5, 1.0)


def may_run_again(run: Run) -> bool:
    """Whether a run cut off mid-job (its process died, or stopped past the grace) may be
    run again: its schedule allows it (``allow_stale_reentry``), or its job is atomic, so
    nothing of the cut-off attempt stayed. A process that does not have the job goes by
    the schedule alone."""
    return run.schedule.allow_stale_reentry or registry.is_atomic(run.job_name)


def plan_retry(failed: Run, now: datetime) -> Run:
    """Record a new run that repeats ``failed`` (same plan time, job and arguments), under
    its schedule's overlap policy, as the admin's "Retry" does."""
    return failed.schedule.plan_extra_run(
        now,
        trigger=Run.Trigger.RETRY,
        plan_time=failed.plan_time,
        scope=failed.scope,
        **failed.snapshot,
    )
