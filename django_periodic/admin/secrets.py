"""What the admin never shows nor filters by: a schedule's secrets (``SECRET_FIELDS``, the
ping URL). Not on the page of a user who may only view (``without_secrets``), and reached
by no lookup of any change list, whoever asks (``SecretsUnfiltered``): a filter such as
``?ping_url__startswith=https://hc-ping.com/0`` tells by the rows it leaves whether the
secret starts so, and so spells it out one character at a time."""

from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Model
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

from django_periodic.models import Schedule
from django_periodic.models.schedule_fields import SECRET_FIELDS

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldOpts
    from django_stubs_ext import StrOrPromise

# The prefixes a search field may have (^name, =scope, @text).
SEARCH_PREFIXES = "^=@"


def reaches_secret(model: type[Model], lookup: str) -> bool:
    """Whether ``lookup`` (``ping_url__regex``, ``schedule__ping_url__startswith``) reads a
    secret field, through any relation, forward or reverse."""
    for part in lookup.split(LOOKUP_SEP):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return False  # a lookup or transform of the field before it; or no field at all
        if issubclass(model, Schedule) and field.name in SECRET_FIELDS:
            return True
        if field.related_model is None or isinstance(field.related_model, str):
            return False
        model = field.related_model
    return False


class SecretsUnfiltered:
    """No filter of the change list (its query string) and no search field reaches a
    secret, even for a superuser: such a filter is refused with a 400, as Django refuses
    any lookup it does not allow. A mixin, before ModelAdmin."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if reaches_secret(_model_admin(self).model, lookup):
            return False
        return _model_admin(super()).lookup_allowed(lookup, value, request)

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        return [
            name
            for name in _model_admin(super()).get_search_fields(request)
            if not reaches_secret(_model_admin(self).model, name.lstrip(SEARCH_PREFIXES))
        ]


def _model_admin(mixed: object) -> "admin.ModelAdmin[Any]":
    """The ModelAdmin the mixin is mixed into (or its next class, from ``super()``)."""
    return cast("admin.ModelAdmin[Any]", mixed)


def without_secrets(
    fieldsets: "list[tuple[StrOrPromise | None, _FieldOpts]]",
) -> "list[tuple[StrOrPromise | None, _FieldOpts]]":
    """The fieldsets for a user who may only view: no secret (``SECRET_FIELDS``, the ping
    URL) is on the page at all, not even read-only, nor in its source."""
    shown = []
    for title, options in fieldsets:
        fields = [name for name in options["fields"] if name not in SECRET_FIELDS]
        if fields:
            kept = options.copy()
            kept["fields"] = fields
            shown.append((title, kept))
    return shown
