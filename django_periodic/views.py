"""The health endpoint: 200 when nothing needs attention, else 503, with the checks' verdict
as a small JSON body (see docs/deployment.md, Monitoring)."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_periodic import clock
from django_periodic.operations import health


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """``{"ok": ..., "now": ..., "problems": [{"check", "message"}]}``; a constant number of
    queries (the database's clock and :func:`django_periodic.health.attention`'s five)."""
    now = clock.now()
    problems = health.attention(now)
    body = {
        "ok": not problems,
        "now": now,
        "problems": [{"check": p.check, "message": p.message} for p in problems],
    }
    return JsonResponse(body, status=503 if problems else 200)
