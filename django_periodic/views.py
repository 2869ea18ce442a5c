"""The health endpoint: 200 when nothing needs attention, else 503, with the checks' verdict
as a small JSON body (see docs/deployment.md, Monitoring)."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_periodic.db import clock
from django_periodic.operations import health

# Who may read which schedules need attention: who may view them in the admin.
VIEW_PERMISSIONS = ("django_periodic.view_schedule", "django_periodic.change_schedule")


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """``{"ok": ..., "now": ..., "problems": [{"check", "message"}]}``; a constant number of
    queries (the database's clock and :func:`django_periodic.operations.health.attention`'s five).

    Anyone who can reach it learns how many schedules are broken; only a signed-in user
    allowed to view schedules learns which (their names)."""
    now = clock.now()
    problems = health.attention(now, names=_may_view_schedules(request))
    body = {
        "ok": not problems,
        "now": now,
        "problems": [{"check": p.check, "message": p.message} for p in problems],
    }
    return JsonResponse(body, status=503 if problems else 200)


def _may_view_schedules(request: HttpRequest) -> bool:
    # No user without the authentication middleware; an anonymous one costs no query.
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return False
    return any(user.has_perm(permission) for permission in VIEW_PERMISSIONS)
