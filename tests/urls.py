from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("periodic/", include("django_periodic.urls")),
]

if find_spec("health_check"):
    from health_check.views import HealthCheckView

    checks = ["django_periodic.contrib.health_check.PeriodicHealth"]
    urlpatterns.append(path("ht/", HealthCheckView.as_view(checks=checks)))
