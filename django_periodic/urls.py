"""Opt-in URLs: ``path("periodic/", include("django_periodic.urls"))`` serves
``periodic/health/``. No authentication: see docs/deployment.md on protecting it."""

from django.urls import path

from django_periodic.views import health_view

app_name = "django_periodic"
urlpatterns = [path("health/", health_view, name="health")]
