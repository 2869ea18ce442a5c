"""A schedule's alerts: when it needs attention, and how that reads.

Two rules, each off while its field is empty, both judged from a schedule's runs *since its
last success*, that is with a plan time after the latest plan time of its succeeded runs
(of any trigger: a manual run that succeeds shows the job works again):

- **no success in time** (``alert_after``): its oldest scheduled fire since its last
  success has a plan time before ``now - alert_after``. A fire counts whatever became of it
  (still waiting or running, failed, skipped as missed or for an overlap) but one skipped
  by a pause or on a day its calendars close, which nobody expected to run.
- **failing** (``alert_failures``): at least that many of its runs failed since its last
  success; so its last ``alert_failures`` runs that ended succeeded or failed, by plan
  time, all failed. Cancelled and skipped runs neither count nor end a streak.

- **late** (``finish_within``): one of its runs since its last success was not finished
  ``finish_within`` after its plan time (``Run.late_at``, set by engine/runs/deadlines.py).
  A late run that ends succeeded is that last success: the schedule recovers with it.

Failing is the reason given when more than one holds, then late. The scheduler judges
every schedule at once (engine/planning/attention.py) and stores the verdict on it
(``attention_reason``, ``attention_since``); a schedule disabled, or with none of these
fields set, needs no attention.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_periodic.choices import AttentionReason, ErrorCode
from django_periodic.timing import bounds

# A ping URL's longest: healthchecks.io's are under 100 characters; a proxy's may be longer.
PING_URL_MAX_LENGTH = 500

# Why a fire was skipped when nobody expected it to run: it does not count as unsucceeded.
NOT_EXPECTED = (ErrorCode.PAUSED, ErrorCode.CLOSED)

# The schedules whose alerts are judged: enabled, with at least one alert set.
WITH_ALERTS = Q(enabled=True) & (
    Q(alert_after__isnull=False) | Q(alert_failures__isnull=False) | Q(finish_within__isnull=False)
)
# The schedules the attention pass reads (engine/planning/attention.py): with an alert set,
# stored as needing attention, or that may pause themselves for their failures. It is the
# condition of their index (periodic_schedule_judged): a pass reads these rows alone, so
# schedules with none of them cost it nothing, however many there are.
JUDGED = (
    Q(alert_after__isnull=False)
    | Q(alert_failures__isnull=False)
    | Q(finish_within__isnull=False)
    | Q(pause_after_failures__isnull=False)
    | ~Q(attention_reason="")
)


@dataclass(frozen=True)
class Facts:
    """What the rules read of one schedule, gathered for all of them in one query."""

    alert_after: timedelta | None
    alert_failures: int | None
    # The plan time of its oldest scheduled fire since its last success (None: none).
    oldest_unsucceeded: datetime | None
    # Its runs failed since its last success.
    failures: int
    # Whether one of its runs since its last success was late (Run.late_at).
    late: bool = False


def failing(failures: int, threshold: int | None) -> bool:
    """The failing rule: ``failures`` failed runs in a row (since its last success) reach
    ``threshold`` (None: the rule is off). ``alert_failures`` and ``pause_after_failures``
    (engine/planning/self_pausing.py) both judge by it."""
    return threshold is not None and failures >= threshold


def reason(facts: Facts, now: datetime) -> str:
    """Why the schedule needs attention at ``now`` (an ``AttentionReason`` value, a plain
    str), "" if it does not."""
    if failing(facts.failures, facts.alert_failures):
        return AttentionReason.FAILING.value
    if facts.late:
        return AttentionReason.LATE.value
    oldest = facts.oldest_unsucceeded
    if facts.alert_after is not None and oldest is not None and oldest < now - facts.alert_after:
        return AttentionReason.NO_SUCCESS.value
    return ""


def note(
    reason: str,
    alert_after: timedelta | None,
    alert_failures: int | None,
    finish_within: timedelta | None = None,
) -> str:
    """A reason in words, with the schedule's threshold: "no success for 2 hours"."""
    if reason == AttentionReason.FAILING and alert_failures is not None:
        return f"its last {alert_failures} run(s) failed"
    if reason == AttentionReason.NO_SUCCESS and alert_after is not None:
        return f"a fire has gone without a success for over {bounds.show(alert_after)}"
    if reason == AttentionReason.LATE and finish_within is not None:
        return f"a run was not finished within {bounds.show(finish_within)} of its plan time"
    try:
        return str(AttentionReason(reason).label)
    except ValueError:  # written by hand or by something newer
        return reason


class Alerting(models.Model):
    """How ``Schedule`` is watched: its alerts (``schedule_fields.ALERT_FIELDS``), judged by the
    scheduler, and its ping monitor (``PING_FIELDS``), told from outside when its runs start
    and end (operations/pings.py)."""

    alert_after = models.DurationField(
        null=True,
        blank=True,
        help_text=_("Needs attention when a fire goes this long without a success; empty: never."),
    )
    alert_failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Needs attention after this many failed runs in a row; empty: never."),
    )
    # A secret (schedule_fields.SECRET_FIELDS): a healthchecks.io ping URL embeds its check's key.
    # Deadlines (engine/runs/deadlines.py): a run not finished this long after its plan time
    # is late, whatever held it back (waiting, overlap, retries).
    finish_within = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "A run not finished this long after its plan time (waiting and retries "
            "included) is late, and its schedule needs attention; empty: no deadline."
        ),
    )
    cancel_when_late = models.BooleanField(
        default=False,
        db_default=False,
        help_text=_("Cancel a run once it is late (a running job is asked to stop)."),
    )
    ping_url = models.CharField(
        max_length=PING_URL_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "A ping monitor's URL (healthchecks.io style), pinged when its runs start and "
            "end if the PINGS setting is on; empty: none. A secret: shown only to users who "
            "may change the schedule."
        ),
    )

    class Meta:
        abstract = True
