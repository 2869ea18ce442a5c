"""Deadlines: the runs not finished within their schedule's ``finish_within`` of their plan
time (waiting, overlap and retries included) found late, each once, and cancelled where
their schedule says (``cancel_when_late``).

A run's deadline is written when it is recorded (``Run.finish_by``, ``policies.finish_by``),
so finding the late ones is one statement on a partial index of the unfinished runs with a
deadline not yet passed (``periodic_run_deadline``): a pass costs one index probe when
nothing is late, however many schedules and runs there are. The statement flags each run
it finds (``late_at``) where it was not flagged yet, so of any number of processes
looking at once, one flags a run and only that one announces it (``run_late``, once the
transaction commits). Whether its schedule needs attention for it is the attention pass's
to judge (``models.alerting``), from ``late_at``.
"""

import logging
from datetime import datetime

from django_periodic import signals
from django_periodic.db import announcements
from django_periodic.engine import tracing
from django_periodic.engine.backends import ledger
from django_periodic.engine.records import LateRun
from django_periodic.engine.runs import leases
from django_periodic.escaping import escaped
from django_periodic.models import Run

logger = logging.getLogger("django_periodic")


def flag_late(now: datetime, using: str = "default") -> list[LateRun]:
    """Find the runs late at ``now`` (the database's clock), flag them, cancel those whose
    schedule says so, and announce each once; return them.

    The loop calls it in its tick's transaction, so that a run is flagged and cancelled
    together; with nothing late, it is the one statement that found nothing."""
    late = ledger(using).flag_late(now)
    if not late:
        return late
    cancelled = [run.pk for run in late if run.cancel]
    if cancelled:
        # As a user's cancel: not started, it ends cancelled; running, its job is asked to
        # stop (its context's ``cancelled``), and the run ends cancelled when it does.
        leases.request_cancel(Run.objects.using(using).filter(pk__in=cancelled), now)
    if signals.listened(signals.run_late):
        announcements.send_on_commit((_event(run, now, using) for run in late), using)
    for run in late:
        _log(run, now)
    if tracing.tracer is not None:
        tracing.tracer.late(late, now)
    return late


def _event(run: LateRun, now: datetime, using: str) -> signals.Event:
    return signals.run_event(
        signals.run_late,
        run_id=run.pk,
        schedule_id=run.schedule_id,
        schedule=run.schedule,
        scope=run.scope,
        plan_time=run.plan_time,
        attempt=run.attempt,
        status=run.status,
        using=using,
        finish_by=run.finish_by,
        late_by=run.late_by(now),
        cancelled=run.cancel,
    )


def _log(run: LateRun, now: datetime) -> None:
    action = "; cancelling it" if run.cancel else ""
    logger.warning(
        "Run %d of schedule %r (planned %s) is late: not finished by %s, %s ago%s.",
        run.pk,
        escaped(run.schedule),
        f"{run.plan_time:%Y-%m-%d %H:%M:%S}",
        f"{run.finish_by:%Y-%m-%d %H:%M:%S}",
        run.late_by(now),
        action,
    )
