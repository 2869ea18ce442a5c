"""Concurrency limits: how many runs of the schedules that name one may hold a slot at once,
across every process and hand-off worker (optionally per scope key).

A run of a limited schedule is recorded *held*: its release time is ``HELD``, past every
real one, so that no claim takes it (nor a claim of a release that knows nothing of limits),
and its real release waits in ``held_release_at``. Admission (``engine/runs/admission.py``)
gives the oldest held runs, by plan time, their release back while their limit has free
slots. A run holds its slot from its admission until it ends, its retries included; one
still held past its start deadline is skipped (``ErrorCode.CONCURRENCY_LIMIT``).

A limit is versioned as a schedule is (docs/versions.md): each ``save()`` that changes one of
``VERSIONED_FIELDS`` writes a ``LimitVersion`` in its transaction, by the rules of
models/versions.py (who and why from ``changed_by()``, values as JSON, ``KEEP_VERSIONS``).
"""

from datetime import UTC, datetime
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Case, F, Q, When
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic import choices
from django_periodic.db import clock
from django_periodic.models import versions

# A held run's release time: later than any real one (timing/bounds.py keeps those before
# 9000), early enough that adding a lead or a lease to it stays a valid time.
HELD = datetime(8999, 1, 1, tzinfo=UTC)
# Runs waiting for their limit: held, and not started (or not restarted) yet.
WAITING = Q(release_at=HELD, status__in=choices.CLAIMABLE_STATUSES)
# Runs holding a slot of their limit: admitted (no longer held), and not ended.
HOLDING = Q(status__in=choices.SLOT_STATUSES) & ~Q(release_at=HELD)
FINAL = frozenset(choices.FINAL_STATUSES)
MAX_SLOTS = 10_000
# What a limit's versions record: every field a user sets.
VERSIONED_FIELDS = ("name", "max_running", "per_scope", "description")


def unheld() -> dict[str, Any]:
    """The columns of runs ending unadmitted (skipped, cancelled), for ``update()``: a held
    run gets its own release back, as admission gives it; any other keeps its own."""
    release = Case(When(release_at=HELD, then=F("held_release_at")), default=F("release_at"))
    return {"release_at": release, "held_release_at": None}


def hold(fields: dict[str, Any]) -> dict[str, Any]:
    """A new run's fields as recorded: held (its release kept in ``held_release_at``, None
    meaning its plan time, as for ``release_at``) if its schedule names a concurrency limit
    and it is recorded to start, as it is from every path that records runs."""
    if fields.get("concurrency_limit_id") is None or fields.get("status") in FINAL:
        return fields
    return {**fields, "release_at": HELD, "held_release_at": fields.get("release_at")}


class ConcurrencyLimit(models.Model):
    """A named cap on how many runs of the schedules that name it may run at once."""

    name = models.CharField(max_length=100, unique=True)
    max_running = models.PositiveIntegerField(
        _("slots"),
        validators=[MinValueValidator(1), MaxValueValidator(MAX_SLOTS)],
        help_text=_("How many of its runs may hold a slot (be admitted or running) at once."),
    )
    per_scope = models.BooleanField(
        default=False,
        db_default=False,
        help_text=_("Each scope key of a fanned-out schedule has this many slots of its own."),
    )
    description = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=clock.wall_now, db_default=Now(), editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__gte=1, max_running__lte=MAX_SLOTS),
                name="periodic_limit_slots_in_range",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save it, and, if that changed one of ``VERSIONED_FIELDS``, a version of the change
        (who and why as ``changed_by()`` says) in the same transaction."""
        using = kwargs.get("using") or self._state.db or "default"
        with transaction.atomic(using=using):
            before = None if self._state.adding else versioned_row(self.pk, using, lock=True)
            super().save(*args, **kwargs)
            record(self, before, using)


class LimitVersion(versions.Version):
    """A concurrency limit as one change left it: when, who, why, and what changed."""

    limit = models.ForeignKey(ConcurrencyLimit, on_delete=models.CASCADE, related_name="versions")

    class Meta(versions.Version.Meta):
        indexes = [
            # A limit's versions in the order they were recorded: its history page lists
            # them, and trim_versions() reads its newest KEEP_VERSIONS and no more.
            models.Index(fields=["limit", "-id"], name="periodic_limitversion_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.limit_id} at {self.created_at:%Y-%m-%d %H:%M:%S}"


def versioned_row(pk: int, using: str, *, lock: bool = False) -> dict[str, Any] | None:
    """The ``VERSIONED_FIELDS`` of the limit ``pk`` as its row holds them, as JSON (None: no
    such row); ``lock``: locked until the transaction ends, so that concurrent edits each
    diff against the change before theirs."""
    rows = ConcurrencyLimit.objects.using(using).filter(pk=pk)
    row = (rows.select_for_update() if lock else rows).values(*VERSIONED_FIELDS).first()
    return None if row is None else {name: versions.as_json(row[name]) for name in row}


def record(limit: ConcurrencyLimit, before: dict[str, Any] | None, using: str) -> None:
    """After its save: the version of what it changed from ``before`` (None: a new limit,
    every field from None), if anything, and its versions trimmed to ``KEEP_VERSIONS``."""
    after = versioned_row(limit.pk, using)
    changes = versions.diff(before, after or {})
    if not changes:
        return
    who = versions.author()
    LimitVersion.objects.using(using).create(
        limit_id=limit.pk, by=who.by, reason=who.reason, changes=changes, fields=after
    )
    if before is not None:  # a new limit's first version: none older to trim
        versions.trim_versions(LimitVersion, "limit_id", [limit.pk], using)
