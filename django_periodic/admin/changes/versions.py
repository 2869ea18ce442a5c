"""Versions in the admin, a schedule's and a concurrency limit's (``Versioned``): a save of
the form is a version by the user, for the reason given; the history page lists them with
their changes field by field (old -> new), who made each and why; "Restore this version";
and each run's revision linked to its schedule's (docs/versions.md)."""

import json
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import localtime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy

from django_periodic.models import LimitVersion, Run, ScheduleVersion, changed_by, restore_version
from django_periodic.models import versions as versioning
from django_periodic.models.schedule_fields import SECRET_FIELDS

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

AnyVersion = ScheduleVersion | LimitVersion
# The newest versions a history page lists (retention keeps KEEP_VERSIONS of them).
PAGE_SIZE = 200


class Change(NamedTuple):
    field: str
    old: str
    new: str


def shown(value: Any) -> str:
    """A recorded value for a person: text as it is, anything else as JSON, none as "—"."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, sort_keys=True)


def changes_of(version: AnyVersion) -> list[Change]:
    """Its changes for a person, field by field (a secret's as set, changed or removed)."""
    return [
        Change(name, *(_secret(old, new) if name in SECRET_FIELDS else (shown(old), shown(new))))
        for name, (old, new) in version.changes.items()
    ]


def _secret(old: Any, new: Any) -> tuple[str, str]:
    """A secret's change (the ping URL), of which a version holds only fingerprints: set,
    changed or removed, never the value, nor its fingerprint."""
    if old and new:
        return _("(set)"), _("(changed)")
    return (_("(set)") if old else shown(old)), (_("(set)") if new else shown(new))


def reason_field() -> forms.CharField:
    """The form field of why a change is made (not a field of the model): its version
    records it."""
    return forms.CharField(
        label=_lazy("Reason"),
        required=False,
        max_length=versioning.REASON_MAX_LENGTH,
        help_text=_lazy("Why this change: its version in the history records it."),
    )


class Versioned:
    """The admin of a versioned model (a schedule, a concurrency limit): a save of its form
    is a version by this user, for the reason given (the form's ``version_reason``); its
    history page lists its versions; "Restore this version". A mixin, before ModelAdmin."""

    def get_urls(self) -> list[URLPattern]:
        model_admin = _model_admin(self)
        info = model_admin.opts.app_label, model_admin.opts.model_name
        restore = path(
            "<path:object_id>/history/<int:version_id>/restore/",
            model_admin.admin_site.admin_view(self.restore_view),
            name="{}_{}_restore".format(*info),
        )
        return [restore, *_model_admin(super()).get_urls()]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Save it as a version by this user, for the reason given on the form."""
        reason = form.cleaned_data.get("version_reason", "")
        with changed_by(request.user.get_username(), reason):
            _model_admin(super()).save_model(request, obj, form, change)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = history_context(_model_admin(self), request, object_id)
        return _model_admin(super()).history_view(
            request, object_id, {**context, **(extra_context or {})}
        )

    def restore_view(
        self, request: HttpRequest, object_id: str, version_id: int
    ) -> HttpResponseBase:
        return restore_view(_model_admin(self), request, object_id, version_id)


def _model_admin(mixed: object) -> "ModelAdmin[Any]":
    """The ModelAdmin the mixin is mixed into (or its next class, from ``super()``)."""
    return cast("ModelAdmin[Any]", mixed)


def _restorable(model_admin: "ModelAdmin[Any]", request: HttpRequest, obj: Model) -> bool:
    """Whether this user may restore its versions: not a schedule defined in code, whose
    code would undo it at the next sync."""
    code_defined = getattr(obj, "is_code_defined", False)
    return model_admin.has_change_permission(request, obj) and not code_defined


def history_context(
    model_admin: "ModelAdmin[Any]", request: HttpRequest, object_id: str
) -> dict[str, Any]:
    """What the history page adds to Django's: the versions, newest first, each with its
    changes, whether it may be restored from here, and (a schedule's) the anchor of the
    first of its revision, which a run's revision links to."""
    obj = model_admin.get_object(request, unquote(object_id))
    if obj is None:
        return {}
    listed = list(obj.versions.order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    restorable = _restorable(model_admin, request, obj)
    info = model_admin.opts.app_label, model_admin.opts.model_name
    anchors: set[str] = set()
    rows = []
    for index, version in enumerate(listed[:PAGE_SIZE]):
        anchor = _anchor(version, anchors)
        url = ""
        if restorable and index > 0:
            url = reverse("admin:{}_{}_restore".format(*info), args=[obj.pk, version.pk])
        rows.append(
            {
                "version": version,
                "changes": changes_of(version),
                "anchor": anchor,
                "restore_url": url,
            }
        )
    return {"versions": rows, "more_versions": len(listed) > PAGE_SIZE}


def _anchor(version: AnyVersion, taken: set[str]) -> str:
    """The id of a schedule's newest version of each revision ("revision-3"), once."""
    if not isinstance(version, ScheduleVersion):
        return ""
    anchor = f"revision-{version.revision}"
    if anchor in taken:
        return ""
    taken.add(anchor)
    return anchor


def restore_view(
    model_admin: "ModelAdmin[Any]", request: HttpRequest, object_id: str, version_id: int
) -> HttpResponseBase:
    """ "Restore this version" (POST): its fields back, as a new version; the errors of one
    that no longer validates, and nothing saved."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    obj = model_admin.get_object(request, unquote(object_id))
    if obj is None:
        raise Http404(_("No such %(name)s.") % {"name": model_admin.opts.verbose_name})
    if not _restorable(model_admin, request, obj):
        raise PermissionDenied
    version = obj.versions.filter(pk=version_id).first()
    if version is None:
        raise Http404(_("No such version."))
    info = model_admin.opts.app_label, model_admin.opts.model_name
    history = reverse("admin:{}_{}_history".format(*info), args=[obj.pk])
    try:
        restored = restore_version(version, by=request.user.get_username())
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            label = "" if field == "__all__" else f"{field}: "
            message = _("Not restored: %(errors)s") % {"errors": label + " ".join(errors)}
            model_admin.message_user(request, message, messages.ERROR)
        return HttpResponseRedirect(history)
    model_admin.message_user(request, _restored(version), messages.SUCCESS)
    model_admin.log_change(request, restored, _restored(version))
    return HttpResponseRedirect(history)


def _restored(version: AnyVersion) -> str:
    """What the admin says of a version it restored: a schedule's by its revision."""
    if isinstance(version, ScheduleVersion):
        return _("Restored the version of revision %(number)d.") % {"number": version.revision}
    when = date_format(localtime(version.created_at), "DATETIME_FORMAT")
    return _("Restored the version of %(when)s.") % {"when": when}


def revision_link(run: Run) -> SafeString | str:
    """The revision a run ran under, linked to its schedule's versions of that revision
    (the history page, at that revision): no query per run."""
    if run.schedule_revision is None:
        return "—"
    url = reverse("admin:django_periodic_schedule_history", args=[run.schedule_id])
    number = run.schedule_revision
    return format_html('<a href="{}#revision-{}">{}</a>', url, number, number)
