"""Calendars: the days and periods on which the schedules that use them do not fire.

A ``Calendar`` row holds its closed weekdays, closed dates, public holidays (the optional
``holidays`` package) and blackout periods; ``business_days`` owns what they mean. A
schedule names its calendars (``Schedule.calendars``) and what becomes of a fire on a
closed day (``Schedule.on_closed_day``). ``closures_of`` is the one place a schedule's
calendars become rules.

A calendar and the triggers of its schedules are validated together: ``clean()`` and
``save()`` refuse a calendar under which a schedule using it would have no next fire within
reach (``next_fire_error``), on the field that changed, rather than fail that schedule later.
"""

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_periodic.choices import OnClosedDay
from django_periodic.db import clock
from django_periodic.models.schedule_fields import ScheduleFields
from django_periodic.models.trigger_rows import TriggerRow, first_fire_time_of, trigger_of
from django_periodic.timing import business_days
from django_periodic.timing.business_days import CalendarRules, Closures
from django_periodic.timing.triggers import InvalidTrigger

# The fields that say what a calendar closes: an error about what it closes goes on the
# first of them that changed.
CLOSING_FIELDS = (
    "closed_weekdays",
    "closed_dates",
    "blackouts",
    "holidays_country",
    "holidays_subdivision",
    "timezone",
)
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
        planned again from now, as after an edited trigger.

        Raises ValidationError, saving nothing, for values ``clean()`` refuses, or when a
        schedule using it would have no next fire within reach under it.
        """
        self._refuse(business_days.calendar_errors(*self._rule_values()))
        using = kwargs.get("using") or self._state.db or "default"
        field = self._changed_field(using)
        with transaction.atomic(using=using):
            super().save(*args, **kwargs)
            try:
                self.schedules.using(using).filter(enabled=True).reschedule(clock.now(using))
            except InvalidTrigger as exc:
                raise ValidationError({field: _never_runs([str(exc)])}) from None

    def rules(self) -> CalendarRules:
        """Its rules; raises InvalidTrigger for a value that cannot be used."""
        return CalendarRules.parse(*(getattr(self, name) for name in RULE_FIELDS))

    def clean(self) -> None:
        """Refuse values that cannot be used (docs/calendars.md, "Bad rows"), more closed
        dates or blackouts than ``business_days`` allows, and a calendar under which a
        schedule using it would have no next fire within reach."""
        self._refuse(business_days.calendar_errors(*self._rule_values()))
        if self.pk is not None:
            using = self._state.db or "default"
            if messages := self._schedule_errors(using):
                raise ValidationError({self._changed_field(using): _never_runs(messages)})

    def _rule_values(self) -> list[Any]:
        return [getattr(self, name) for name in RULE_FIELDS[1:]]

    def _refuse(self, found: list[tuple[str, str]]) -> None:
        errors: dict[str, list[str]] = {}
        for field, message in found:
            errors.setdefault(field, []).append(message)
        if errors:
            raise ValidationError(errors)

    def _schedule_errors(self, using: str) -> list[str]:
        """Why enabled schedules using it would have no next fire under it as it is now."""
        rules = self.rules()
        now = clock.wall_now()
        schedules = self.schedules.using(using).filter(enabled=True).prefetch_related("calendars")
        errors = []
        for schedule in schedules:
            try:
                others = [c.rules() for c in schedule.calendars.all() if c.pk != self.pk]
            except InvalidTrigger:
                continue  # another calendar it uses is bad: the planner says so on it
            closures = Closures(tuple(sorted([rules, *others], key=lambda r: r.name)))
            if message := next_fire_error(schedule, closures, now):
                errors.append(message)
        return errors

    def _changed_field(self, using: str) -> str:
        """The first of CLOSING_FIELDS that differs from the stored row (the first of them
        if none does, or it is new)."""
        if self.pk is not None:
            stored = Calendar.objects.using(using).filter(pk=self.pk).values(*CLOSING_FIELDS)
            row = stored.first()
            for name in CLOSING_FIELDS if row is not None else ():
                if row[name] != getattr(self, name):
                    return name
        return CLOSING_FIELDS[0]


def _never_runs(messages: list[str]) -> str:
    count = len(messages)
    which = "a schedule" if count == 1 else f"{count} schedules"
    return f"Under this calendar {which} using it would never run: {messages[0]}"


def next_fire_error(schedule: TriggerRow, closures: Closures | None, now: datetime) -> str | None:
    """Why the first fire of ``schedule`` after ``now`` under ``closures`` cannot be found
    (they close every fire of its trigger within reach), or None. A trigger that is bad in
    itself is not judged here: its own validation says why."""
    if closures is None or schedule.on_closed_day not in OnClosedDay.values:
        return None
    try:
        trigger_of(schedule)
    except InvalidTrigger:
        return None
    try:
        first_fire_time_of(schedule, now, closures)
    except InvalidTrigger as exc:
        return str(exc)
    return None


def closures_of(schedule: ScheduleFields) -> Closures | None:
    """A saved schedule's calendars as rules (None: it has none); a query unless its
    calendars were prefetched. Raises InvalidTrigger for a calendar that cannot be used."""
    if schedule.pk is None:
        return None
    return closures_from(schedule.calendars.all())


def expect_calendars(schedule: ScheduleFields, calendars: "Any") -> None:
    """Validate ``schedule`` (``full_clean()``) with these calendars: a form's, which are
    set only once the schedule is saved."""
    schedule.__dict__["_expected_calendars"] = list(calendars)


def checked_closures(schedule: ScheduleFields) -> Closures | None:
    """The calendars a schedule is validated with, as rules: those ``expect_calendars()``
    named, else its saved ones. Raises InvalidTrigger for one that cannot be used."""
    expected = schedule.__dict__.get("_expected_calendars")
    return closures_of(schedule) if expected is None else closures_from(expected)


def closures_from(calendars: "Any") -> Closures | None:
    """These calendars (rows, or value tuples in ``RULE_FIELDS`` order) as rules."""
    rules = [
        calendar.rules() if isinstance(calendar, Calendar) else CalendarRules.parse(*calendar)
        for calendar in calendars
    ]
    return Closures(tuple(rules)) if rules else None
