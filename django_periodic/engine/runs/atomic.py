"""Atomic jobs (``@job(atomic=True)``): the job's writes and its outcome in one transaction.

The job is called inside a transaction on its run's database; its success is recorded in
that same transaction, under its lease's token, and everything commits together. If the
lease was lost meanwhile (the process froze past it, another process took the run, its
timeout failed it), the record finds no lease and the job's writes roll back with it. A
job that raises, is cancelled or times out rolls back its writes; then its failure is
recorded as any job's, and retried as its schedule says. After a crash nothing of the job
remains, so its run is run again whatever ``allow_stale_reentry`` says
(``retries.may_run_again``): at-least-once delivery, exactly-once effects on that database.

Writes to other databases, HTTP calls and mail are not covered; the job's ``on_commit``
hooks run only when it committed. See docs/semantics.md, "Atomic jobs".
"""

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError

from django_periodic.choices import RunStatus
from django_periodic.db import CONNECTION_ERRORS
from django_periodic.engine.records import AttemptOutcome, Claim, Failure
from django_periodic.engine.runs import outcomes

logger = logging.getLogger("django_periodic")

# What a job that manages the transaction itself is told.
MISUSE = (
    "An atomic job runs inside the transaction that records its outcome: it cannot commit, "
    "roll back, leave autocommit or open a durable atomic block itself ({error})."
)
BROKEN = (
    "Its transaction was left broken: a database error was caught inside the job without a "
    "savepoint of its own (wrap the statement that may fail in transaction.atomic()), so "
    "nothing it wrote can commit ({error})."
)


class AtomicJobError(Exception):
    """An atomic job left its transaction unable to commit."""


class _Undone(Exception):
    """Roll the job's writes back; record ``outcome`` afterwards (None: nothing to record)."""

    def __init__(self, outcome: AttemptOutcome | None) -> None:
        self.outcome = outcome


# PostgreSQL's SQLSTATE for a statement sent in a transaction an earlier error aborted.
IN_FAILED_TRANSACTION = "25P02"

OutcomeOf = Callable[[Any, BaseException | None], AttemptOutcome | None]


def call(claim: Claim, job: Callable[[], Any], outcome_of: OutcomeOf) -> AttemptOutcome | None:
    """Call ``job`` and record its success in one transaction on the run's database.

    ``outcome_of(result, error)`` decides the outcome as for any job. Returns the outcome
    recorded here (``recorded``), or one still to record (the job's writes rolled back),
    or None if its lease was lost (writes rolled back, nothing to record).
    """
    try:
        with transaction.atomic(using=claim.using):
            outcome = outcome_of(job(), None)
            if outcome is None or outcome.status != RunStatus.SUCCEEDED:
                raise _Undone(outcome)  # cancelled or timed out: nothing of it stays
            if claim.values.pk not in _record(outcome, claim.using):
                logger.warning(
                    "Run %s ended after losing its lease; its writes were rolled back.",
                    claim.values.pk,
                )
                raise _Undone(None)
            return replace(outcome, recorded=True)
    except _Undone as undone:
        return undone.outcome
    except AtomicJobError as error:  # a database error caught inside it: may pass next time
        return _failed(claim, outcome_of, error, str(error), retryable=True)
    except (TransactionManagementError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and "durable" not in str(error):
            return outcome_of(None, error)
        # It manages the transaction itself: it would do the same next time.
        return _failed(claim, outcome_of, error, MISUSE.format(error=error), retryable=False)
    except BaseException as error:
        return outcome_of(None, error)


def _record(outcome: AttemptOutcome, using: str) -> set[int]:
    """Record the success in the job's transaction, if the job left it able to commit."""
    if connections[using].needs_rollback:
        raise AtomicJobError(BROKEN.format(error="Django marked it for rollback"))
    try:
        return outcomes.record_in_one(outcome, using)
    except CONNECTION_ERRORS:
        raise
    except DatabaseError as error:
        if getattr(error.__cause__, "sqlstate", None) == IN_FAILED_TRANSACTION:
            raise AtomicJobError(BROKEN.format(error=error)) from error
        raise


def _failed(
    claim: Claim, outcome_of: OutcomeOf, error: BaseException, message: str, *, retryable: bool
) -> AttemptOutcome | None:
    decided = outcome_of(None, error)
    if decided is None or decided.error_code != type(error).__qualname__:
        return decided  # a stop request (cancel, timeout) still wins
    failure = Failure(code=type(error).__qualname__, message=message, retryable=retryable)
    return outcomes.failed(claim, failure).started(decided.started_at)
