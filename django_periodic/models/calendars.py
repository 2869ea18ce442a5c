"""Calendars: the days and periods on which the schedules that use them do not fire.

A ``Calendar`` row holds its closed weekdays, closed dates, public holidays (the optional
``holidays`` package) and blackout periods; ``business_days`` owns what they mean. A
schedule names its calendars (``Schedule.calendars``) and what becomes of a fire on a
closed day (``Schedule.on_closed_day``). ``closures_of`` is the one place a schedule's
calendars become rules.
"""

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic import business_days, clock
from django_periodic.business_days import CalendarRules, Closures

if TYPE_CHECKING:
    from django_periodic.models.schedule import Schedule

# The values a calendar's rules are built from, in CalendarRules.parse's order.
RULE_FIELDS = (
    "name",
    "timezone",
    "holidays_country",
    "holidays_subdivision",
    "closed_weekdays",
    "closed_dates",
    "blackouts",
)


def _default_timezone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or "UTC"


class Calendar(models.Model):
    """Closed days and blackout periods, shared by the schedules that name it."""

    name = models.CharField(max_length=200)  # unique: see Meta.constraints
    timezone = models.CharField(
        max_length=64, default=_default_timezone, help_text=_("Its days are days here.")
    )
    holidays_country = models.CharField(
        max_length=8,
        blank=True,
        default="",
        db_default="",
        help_text=_("Closed on this country's public holidays (ISO code, e.g. DE); needs "
                    "the holidays package."),
    )  # fmt: skip
    holidays_subdivision = models.CharField(
        max_length=16,
        blank=True,
        default="",
        db_default="",
        help_text=_("A state or province of it, e.g. BY."),
    )
    closed_weekdays = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        help_text=_("0 (Monday) to 6 (Sunday), e.g. [5, 6]."),
    )
    closed_dates = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        help_text=_('Dates, e.g. ["2026-12-24", "2026-12-31"].'),
    )
    blackouts = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        help_text=_(
            'Periods, e.g. [{"start": "2026-12-18T18:00+01:00", "end": '
            '"2027-01-04T06:00+01:00", "reason": "year-end freeze"}].'
        ),
    )
    updated_at = models.DateTimeField(auto_now=True, db_default=Now())

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="periodic_calendar_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, then move the cursors of its schedules: a fire it now closes or opens is
        planned again from now, as after an edited trigger."""
        super().save(*args, **kwargs)
        using = self._state.db or "default"
        self.schedules.using(using).filter(enabled=True).reschedule(clock.now(using))

    def rules(self) -> CalendarRules:
        """Its rules; raises InvalidTrigger for a value that cannot be used."""
        return CalendarRules.parse(*(getattr(self, name) for name in RULE_FIELDS))

    def clean(self) -> None:
        values = [getattr(self, name) for name in RULE_FIELDS[1:]]
        errors: dict[str, list[str]] = {}
        for field, message in business_days.calendar_errors(*values):
            errors.setdefault(field, []).append(message)
        if errors:
            raise ValidationError(errors)


def closures_of(schedule: "Schedule") -> Closures | None:
    """A saved schedule's calendars as rules (None: it has none); a query unless its
    calendars were prefetched. Raises InvalidTrigger for a calendar that cannot be used."""
    if schedule.pk is None:
        return None
    return closures_from(schedule.calendars.all())


def closures_from(calendars: "Any") -> Closures | None:
    """These calendars (rows, or value tuples in ``RULE_FIELDS`` order) as rules."""
    rules = [
        calendar.rules() if isinstance(calendar, Calendar) else CalendarRules.parse(*calendar)
        for calendar in calendars
    ]
    return Closures(tuple(rules)) if rules else None
