from django.contrib import admin
from django.urls import include, path
from health_check.views import HealthCheckView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("periodic/", include("django_periodic.urls")),
]

checks = ["django_periodic.contrib.health_check.PeriodicHealth"]
urlpatterns.append(path("ht/", HealthCheckView.as_view(checks=checks)))
