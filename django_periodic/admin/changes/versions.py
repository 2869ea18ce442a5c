"""A schedule's versions in the admin: its history page lists them with their changes field
by field (old -> new), who made each and why; "Restore this version"; and each run's
revision linked to them (docs/versions.md)."""

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_periodic.models import Run, Schedule, ScheduleVersion, restore_version
from django_periodic.models.schedule_fields import SECRET_FIELDS

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

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


def changes_of(version: ScheduleVersion) -> list[Change]:
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


def history_context(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, object_id: str
) -> dict[str, Any]:
    """What the history page adds to Django's: the versions, newest first, each with its
    changes and whether it may be restored from here."""
    schedule = model_admin.get_object(request, unquote(object_id))
    if schedule is None:
        return {}
    listed = list(schedule.versions.order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    restorable = model_admin.has_change_permission(request, schedule)
    restorable = restorable and not schedule.is_code_defined
    info = model_admin.opts.app_label, model_admin.opts.model_name
    rows = [
        {
            "version": version,
            "changes": changes_of(version),
            "restore_url": reverse(
                "admin:{}_{}_restore".format(*info), args=[schedule.pk, version.pk]
            )
            if restorable and index > 0
            else "",
        }
        for index, version in enumerate(listed[:PAGE_SIZE])
    ]
    return {"versions": rows, "more_versions": len(listed) > PAGE_SIZE}


def restore_view(
    model_admin: "ModelAdmin[Schedule]", request: HttpRequest, object_id: str, version_id: int
) -> HttpResponseBase:
    """ "Restore this version" (POST): its fields back, as a new version; the errors of one
    that no longer validates, and nothing saved."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    schedule = model_admin.get_object(request, unquote(object_id))
    if schedule is None:
        raise Http404(_("No such schedule."))
    if not model_admin.has_change_permission(request, schedule) or schedule.is_code_defined:
        raise PermissionDenied
    version = schedule.versions.filter(pk=version_id).first()
    if version is None:
        raise Http404(_("No such version."))
    info = model_admin.opts.app_label, model_admin.opts.model_name
    history = reverse("admin:{}_{}_history".format(*info), args=[schedule.pk])
    try:
        restored = restore_version(version, by=request.user.get_username())
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            label = "" if field == "__all__" else f"{field}: "
            message = _("Not restored: %(errors)s") % {"errors": label + " ".join(errors)}
            model_admin.message_user(request, message, messages.ERROR)
        return HttpResponseRedirect(history)
    message = _("Restored the version of revision %(number)d.") % {"number": version.revision}
    model_admin.message_user(request, message, messages.SUCCESS)
    model_admin.log_change(request, restored, message)
    return HttpResponseRedirect(history)


def revision_link(run: Run) -> SafeString | str:
    """The revision a run ran under, linked to its schedule's versions of that revision
    (the history page, at that revision): no query per run."""
    if run.schedule_revision is None:
        return "—"
    url = reverse("admin:django_periodic_schedule_history", args=[run.schedule_id])
    number = run.schedule_revision
    return format_html('<a href="{}#revision-{}">{}</a>', url, number, number)
