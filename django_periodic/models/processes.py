"""Who executes runs: the live ``run_scheduler`` processes, and the lease each attempt of a
run holds."""

import uuid
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils.translation import gettext_lazy as _

from django_periodic import choices
from django_periodic.conf import get_settings
from django_periodic.models.run import Run


class SchedulerProcessQuerySet(models.QuerySet["SchedulerProcess"]):
    def stale(self, now: datetime) -> "SchedulerProcessQuerySet":
        """Processes presumed dead: no heartbeat for ``SchedulerProcess.stale_after()``."""
        return self.filter(heartbeat_at__lt=now - SchedulerProcess.stale_after())

    def alive(self, now: datetime) -> "SchedulerProcessQuerySet":
        """Processes presumed alive: the others than ``stale(now)``."""
        return self.filter(heartbeat_at__gte=now - SchedulerProcess.stale_after())

    def forgettable(self) -> "SchedulerProcessQuerySet":
        """Those holding no lease any more: their rows can go (the sweeper's pass).

        A process away longer than ``stale_after()`` that still holds a lease keeps its row,
        so that it can take up its heartbeat again if it comes back before the lease expires.
        """
        held = Lease.objects.held().filter(process=OuterRef("pk"))
        return self.filter(~Exists(held))


class SchedulerProcess(models.Model):
    """A live ``run_scheduler`` process; its heartbeat tells operators it is alive."""

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    locked_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_(
            "When it last took its session lock (PostgreSQL), which tells others at once "
            "that it died; empty: it holds none, and only its leases' expiry tells."
        ),
    )

    jobs = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "The jobs its code registers: it claims runs of these only. Empty (NULL): a "
            "release that does not say, which may have any job."
        ),
    )

    ledger_format = models.SmallIntegerField(
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "The ledger format its release reads: it leaves alone schedules and runs of a "
            "later one. Empty: a release before formats, which reads only its own rows."
        ),
    )

    objects = SchedulerProcessQuerySet.as_manager()

    class Meta:
        ordering = ["started_at"]
        verbose_name_plural = _("scheduler processes")

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    # Three heartbeats missed: presumed dead (its leases have expired with the defaults).
    STALE_AFTER_HEARTBEATS = 3

    @classmethod
    def stale_after(cls) -> timedelta:
        """How long without a heartbeat before operators should presume a process dead."""
        # A process holding no lease heartbeats once an IDLE_INTERVAL only.
        settings = get_settings()
        interval = max(settings.HEARTBEAT_INTERVAL, settings.IDLE_INTERVAL)
        return interval * cls.STALE_AFTER_HEARTBEATS

    @classmethod
    def stale_silence(cls, silence: timedelta) -> bool:
        """Whether a process silent (no heartbeat) this long is presumed dead."""
        return silence > cls.stale_after()

    def alive_at(self, now: datetime) -> bool:
        """Whether this process is presumed alive at ``now`` (as ``alive(now)`` selects)."""
        return not self.stale_silence(now - self.heartbeat_at)


# A lease still held: not released yet (by its outcome, the sweeper or a shutdown).
# ``LeaseQuerySet.held()`` filters by it; lookups from a run or a process go through
# ``held_through()``, and statements that read leases as ``l`` through
# ``db.postgresql.HELD_SQL``.
HELD_LOOKUPS = {"released_at__isnull": True}
HELD = Q(**HELD_LOOKUPS)


def held_through(relation: str) -> Q:
    """``HELD`` for the leases reached through ``relation`` (``"leases"`` from a run or a
    process)."""
    return Q(**{f"{relation}__{lookup}": value for lookup, value in HELD_LOOKUPS.items()})


class LeaseQuerySet(models.QuerySet["Lease"]):
    def held(self) -> "LeaseQuerySet":
        """Leases not released yet (``HELD``): their holders own their runs."""
        return self.filter(HELD)

    def expired(self, now: datetime) -> "LeaseQuerySet":
        """Held leases whose holder stopped renewing them before ``now``."""
        return self.held().filter(expires_at__lt=now)

    def release(self, now: datetime, outcome: str) -> int:
        """Release these leases with ``outcome``; how many (``db.postgresql.RELEASE_SQL``
        says it in SQL). A released lease no longer names its process (``holder`` still
        does): a process's row then goes (at its stop, or forgotten by the sweeper) without
        rewriting the history of every run it ever executed, and the index on ``process``
        holds only held leases."""
        return self.update(released_at=now, outcome=outcome, process=None)


class Lease(models.Model):
    """One execution attempt of a run. Only the holder of ``token`` may change the run."""

    Outcome = choices.LeaseOutcome

    # Indexed by the (run, attempt) unique constraint.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases", db_index=False)
    attempt = models.PositiveIntegerField()
    token = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    holder = models.CharField(max_length=300, help_text=_("host:pid of the process."))
    # Named while held only (LeaseQuerySet.release): indexed by periodic_lease_process.
    process = models.ForeignKey(
        SchedulerProcess,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="leases",
        db_index=False,
    )
    acquired_at = models.DateTimeField()
    started_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("When its job was called; empty: claimed, but the job never started."),
    )
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(
        max_length=32, blank=True, default="", db_default="", choices=choices.LeaseOutcome
    )

    objects = LeaseQuerySet.as_manager()

    class Meta:
        # Its own columns: ordering by "run" would join runs to sort by their ordering.
        ordering = ["run_id", "attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "attempt"], name="periodic_lease_one_per_attempt"
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"],
                condition=HELD,
                name="periodic_lease_held",
            ),
            # The leases each process holds (a released lease names none).
            models.Index(
                fields=["process"],
                condition=Q(process__isnull=False),
                name="periodic_lease_process",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.attempt} of run {self.run_id} by {self.holder}"
