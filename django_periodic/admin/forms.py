"""Admin forms: one trigger kind at a time, a registered job, an IANA time zone, JSON arguments.

Every choice is validated with the same functions the model uses, so the admin shows the
ledger's own precise messages (which cron field is wrong, which zone is unknown) on the field.
"""

import json
import sys
import zoneinfo
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.forms.fields import InvalidJSONInput
from django.utils.translation import gettext_lazy as _

from django_periodic import registry, taskbackends
from django_periodic import scopes as scope_providers
from django_periodic.admin.changes.versions import reason_field
from django_periodic.choices import UNSET_TRIGGER
from django_periodic.conf import get_settings
from django_periodic.models import Schedule
from django_periodic.models.calendars import closures_from, expect_calendars
from django_periodic.models.schedule_fields import (
    ALERT_FIELDS,
    CALENDAR_FIELDS,
    JOB_FIELDS,
    LIFECYCLE_FIELDS,
    PING_FIELDS,
    POLICY_FIELDS,
    RETENTION_FIELDS,
    TRIGGER_FIELDS,
)
from django_periodic.models.trigger_rows import KIND_FIELDS
from django_periodic.timing import triggers

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

    # django-stubs makes ModelForm generic; at run time it takes no type arguments.
    _ScheduleModelForm = forms.ModelForm[Schedule]
else:
    _ScheduleModelForm = forms.ModelForm

# On save the other kinds' fields are cleared (see KIND_FIELDS), so a value left behind in
# a field the page hid can never make the schedule ambiguous.
KIND_LABELS = dict(Schedule.Kind.choices)
# The options of the "after" kind, which have defaults of their own.
AFTER_OPTIONS = ("after_outcome", "after_wait")
KIND_REQUIRED: "dict[str, StrPromise]" = {
    Schedule.Kind.CRON: _("A cron trigger needs a cron expression."),
    Schedule.Kind.INTERVAL: _("An interval trigger needs an interval."),
    Schedule.Kind.ONCE: _("A one-shot trigger needs a time to run at."),
    Schedule.Kind.RRULE: _("An RRULE trigger needs its rule (and start_at, where it starts)."),
    Schedule.Kind.AFTER: _('Name the schedules it runs after, e.g. ["extract"].'),
}


@cache
def timezone_names() -> tuple[str, ...]:
    """Every IANA zone name this machine knows, sorted; "localtime" differs between hosts."""
    return tuple(sorted(zoneinfo.available_timezones() - {"localtime"}))


def job_choices() -> list[tuple[str, str]]:
    """Registered jobs as (name, "name — first docstring line") pairs."""
    jobs = sorted(registry.registered_jobs().values(), key=lambda j: j.name)
    return [("", "---------")] + [
        (j.name, f"{j.name} — {j.description}" if j.description else j.name) for j in jobs
    ]


def provider_choices() -> list[tuple[str, str]]:
    """Registered scope providers, as ``job_choices()`` lists jobs; empty: not fanned out."""
    providers = sorted(scope_providers.registered_providers().values(), key=lambda p: p.name)
    return [("", "---------")] + [
        (p.name, f"{p.name} — {p.description}" if p.description else p.name) for p in providers
    ]


class SearchableSelect(forms.Select):
    """A select the admin's bundled select2 makes searchable; a plain select without JS."""

    def __init__(
        self, attrs: dict[str, Any] | None = None, choices: Iterable[tuple[Any, Any]] = ()
    ) -> None:
        super().__init__({"class": "periodic-searchable", **(attrs or {})}, choices)

    @property
    def media(self) -> forms.Media:
        return forms.Media(
            js=[
                "admin/js/vendor/jquery/jquery.js",
                "admin/js/vendor/select2/select2.full.js",
                "admin/js/jquery.init.js",
            ],
            css={"screen": ["admin/css/vendor/select2/select2.css", "admin/css/autocomplete.css"]},
        )


class CheckedChoiceField(forms.ChoiceField):
    """A choice validated by ``check`` (which raises with a precise message), not by the list.

    A stored value that is no longer offered (a removed job) stays selectable, marked, so that
    the page shows what is stored and the error says why it cannot be saved.
    """

    def __init__(self, *, check: Callable[[str], object], **kwargs: Any) -> None:
        self.check = check
        super().__init__(**kwargs)

    def valid_value(self, value: Any) -> bool:
        return True  # validate() runs the precise check instead

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value:
            try:
                self.check(value)
            except (
                triggers.InvalidTrigger,
                registry.UnknownJob,
                scope_providers.UnknownProvider,
            ) as exc:
                raise ValidationError(str(exc), code="invalid_choice") from None

    def offer(self, value: str, label: str) -> None:
        """Add ``value`` to the choices if it is missing."""
        # Once set, the choices are a list or a CallableChoiceIterator, never a callable.
        choices = cast(Iterable[tuple[Any, Any]], self.choices)
        if value and value not in {key for key, _ in choices}:
            self.choices = [*choices, (value, label)]


class JSONArgumentsField(forms.JSONField):
    """A job's ``name`` (args or kwargs) as JSON that says where it is broken, and that a
    schedule can hold (``registry.argument_error``); an empty box means ``empty()`` ([] or
    {})."""

    def __init__(
        self, *, name: str, empty: Callable[[], list[Any] | dict[str, Any]], **kwargs: Any
    ) -> None:
        self.name, self.empty = name, empty
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField"}))
        super().__init__(required=False, **kwargs)

    def to_python(self, value: Any) -> Any:
        if value in self.empty_values:
            return self.empty()
        converted = self._decoded(value)
        if problem := registry.argument_error(self.name, converted):
            raise ValidationError(problem, code="invalid")
        return converted

    def _decoded(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except ValidationError:
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                message = _("Not valid JSON: %(reason)s at line %(line)d, column %(column)d.")
                params = {"reason": exc.msg, "line": exc.lineno, "column": exc.colno}
                raise ValidationError(message, code="invalid", params=params) from None
            raise
        except RecursionError:  # nested deeper than the decoder's stack
            raise ValidationError(registry.too_deep(self.name), code="invalid") from None
        except ValueError:  # valid JSON, but an integer longer than int() reads
            message = _("A number has more than %(most)d digits, more than Python reads.")
            params = {"most": sys.get_int_max_str_digits()}
            raise ValidationError(message, code="invalid", params=params) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        """Arguments it refused show again as they were typed, not encoded again (which,
        deep in the page's templates, a deeply nested value would take past Python's
        recursion limit)."""
        try:
            bound = super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)
        if registry.argument_error(self.name, bound):
            return InvalidJSONInput(data)
        return bound


def tasks_backend_choices(current: str) -> list[tuple[str, str]]:
    """The TASKS aliases a schedule may hand its runs to, after the default; ``current``
    too if it is not one of them (the model's validation then says why)."""
    default = get_settings().TASKS_BACKEND
    label = _("Default (%s)") % (default or _("run_scheduler's own workers"))
    try:
        aliases = taskbackends.aliases()
    except taskbackends.TasksUnavailable:
        aliases = []
    if current and current not in aliases:
        aliases.append(current)
    return [("", str(label)), *((alias, alias) for alias in aliases)]


class ScheduleForm(_ScheduleModelForm):
    """The schedule form of the admin: pick a trigger kind, then fill only its fields."""

    # Not required: a form posted without it (a script) keeps what it fills in, and the
    # model then insists on exactly one trigger.
    trigger_kind = forms.ChoiceField(
        label=_("Trigger kind"),
        choices=Schedule.Kind.choices,
        widget=forms.RadioSelect(attrs={"class": "radiolist inline"}),
        initial="cron",
        required=False,
    )
    job = CheckedChoiceField(
        check=registry.get_job,
        choices=job_choices,
        widget=SearchableSelect(attrs={"data-placeholder": "Search registered jobs"}),
        help_text=_("A function registered with @job (the first line of its docstring)."),
    )
    timezone = CheckedChoiceField(
        check=triggers.parse_timezone,
        choices=lambda: [(name, name) for name in timezone_names()],
        widget=SearchableSelect(),
        help_text=_("The wall clock the cron expression is read on; fire times are shown in it."),
    )
    scopes = CheckedChoiceField(
        check=scope_providers.get_provider,
        choices=provider_choices,
        required=False,
        widget=SearchableSelect(attrs={"data-placeholder": "Search scope providers"}),
        help_text=_(
            "A function registered with @scopes.provider: each fire then runs once per scope "
            "key it returns (a tenant, an account), each run with its own overlap and retries."
        ),
    )
    args = JSONArgumentsField(
        name="args", empty=list, help_text=_('Positional arguments, e.g. [1, "two"].')
    )
    kwargs = JSONArgumentsField(
        name="kwargs", empty=dict, help_text=_('Keyword arguments, e.g. {"key": 1}.')
    )
    # Not a field of the schedule: why this change, which its version records.
    version_reason = reason_field()

    class Meta:
        model = Schedule
        fields = [
            "name",
            "job",
            *JOB_FIELDS,
            "enabled",
            *TRIGGER_FIELDS,
            *CALENDAR_FIELDS,
            *POLICY_FIELDS,
            *RETENTION_FIELDS,
            *ALERT_FIELDS,
            *PING_FIELDS,
            *LIFECYCLE_FIELDS,
        ]
        widgets = {
            "calendars": forms.CheckboxSelectMultiple,
            "ping_url": forms.URLInput(
                attrs={
                    "class": "vURLField",
                    "placeholder": "https://hc-ping.com/<uuid>",
                    "autocomplete": "off",
                    "spellcheck": "false",
                }
            ),
            "rrule": forms.Textarea(
                attrs={
                    "class": "vLargeTextField periodic-rrule",
                    "rows": 3,
                    "placeholder": "RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1",
                    "spellcheck": "false",
                }
            ),
            "cron": forms.TextInput(
                attrs={
                    "class": "vTextField periodic-cron",
                    "placeholder": "*/5 * * * *",
                    "autocomplete": "off",
                    "spellcheck": "false",
                }
            ),
        }
        help_texts = {
            "cron": _(
                "Five fields: minute hour day-of-month month day-of-week; "
                "or @hourly, @daily, @weekly, @monthly, @yearly."
            ),
            "interval": _("e.g. 00:05:00 for five minutes, or 1 00:00:00 for a day."),
            "alert_after": _(
                "Needs attention when a fire goes this long without a success, e.g. 02:00:00 "
                "for two hours; empty: never."
            ),
            "run_at": _("In the site's time zone."),
            "rrule": _(
                "An RRULE line, with optional EXDATE and RDATE lines (wall times in its time "
                "zone, or UTC ending in Z); it starts at start_at."
            ),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trigger_missing = False
        instance = self.instance
        for name in ("job", "timezone", *JOB_FIELDS):
            # Declared fields do not take the model's defaults ([] and TIME_ZONE) by themselves.
            self.initial.setdefault(name, getattr(instance, name))
        if "trigger_kind" in self.fields and instance.trigger_kind:
            self.fields["trigger_kind"].initial = instance.trigger_kind
        if "job" in self.fields:
            job = cast(CheckedChoiceField, self.fields["job"])
            job.offer(instance.job, f"{instance.job} (not registered)")
        if "scopes" in self.fields:
            provider = cast(CheckedChoiceField, self.fields["scopes"])
            provider.offer(instance.scopes, f"{instance.scopes} (not registered)")
        if "timezone" in self.fields:
            timezone = cast(CheckedChoiceField, self.fields["timezone"])
            timezone.offer(instance.timezone, instance.timezone)
        for name in AFTER_OPTIONS:
            if name in self.fields:
                # A form posted without them (a script, the live preview) keeps their values.
                self.fields[name].required = False
        if "tasks_backend" in self.fields:
            self.fields["tasks_backend"].widget = forms.Select(
                choices=tasks_backend_choices(instance.tasks_backend)
            )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        assert cleaned is not None  # a ModelForm's clean() returns cleaned_data
        for name in AFTER_OPTIONS:
            if name in self.fields and cleaned.get(name) in (None, ""):
                cleaned[name] = getattr(self.instance, name)  # its default, or as stored
        kind = cleaned.get("trigger_kind")
        if kind:
            self._keep_one_trigger(kind, cleaned)
        if "calendars" in cleaned:
            # The model validates its trigger with the calendars it is about to have.
            expect_calendars(self.instance, cleaned["calendars"])
        if cleaned.get("calendars"):
            try:
                closures_from(cleaned["calendars"])
            except triggers.InvalidTrigger as exc:  # one stored past its validation
                self.add_error("calendars", str(exc))
        return cleaned

    def _keep_one_trigger(self, kind: str, cleaned: dict[str, Any]) -> None:
        """Clear the fields of the kinds not chosen; require the chosen kind's field."""
        for other, name in KIND_FIELDS.items():
            if other != kind and name in self.fields:
                cleaned[name] = UNSET_TRIGGER[name]
        name = KIND_FIELDS[kind]
        unset = cleaned.get(name, UNSET_TRIGGER[name]) == UNSET_TRIGGER[name]
        if name in self.fields and unset and name not in self.errors:
            self.add_error(name, KIND_REQUIRED[kind])
            self._trigger_missing = True

    def add_error(self, field: str | None, error: Any) -> None:
        # ``error``: anything Form.add_error() takes (the stubs' overloads do not fit a
        # pass-through that looks for ``error_dict``).
        if field is None and hasattr(error, "error_dict"):
            error = self._placed(error.error_dict)
        super().add_error(field, error)

    def _placed(self, error_dict: dict[str, list[ValidationError]]) -> ValidationError:
        """The model's errors, placed where the form can show them.

        The model sees the value the form kept, not the one typed: a field that already has
        an error keeps only the form's (more precise) message, and so does a missing trigger.
        Errors on fields the form shows read-only (a code-defined schedule's trigger) belong
        to the form as a whole.
        """
        placed: dict[str, list[ValidationError | str]] = {}
        for name, errors in error_dict.items():
            if name != NON_FIELD_ERRORS and name in self.errors:
                continue
            if self._trigger_missing and name in KIND_FIELDS.values():
                continue  # "set exactly one trigger": the chosen kind's field already says so
            if name == NON_FIELD_ERRORS or name in self.fields:
                placed.setdefault(name, []).extend(errors)
            else:
                for message in ValidationError(errors).messages:
                    placed.setdefault(NON_FIELD_ERRORS, []).append(f"{name}: {message}")
        return ValidationError(placed)
