from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PeriodicConfig(AppConfig):
    name = "django_periodic"
    verbose_name = "Periodic jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_periodic import checks, error_texts  # noqa: F401  (the checks
        from django_periodic.contrib import opentelemetry, sentry
        from django_periodic.engine.loop import stop_signals
        from django_periodic.operations import alert_mail, pings, runlog

        # No database row values in what the package logs, its tracebacks included.
        error_texts.install()
        # A scheduler stopped while it is still starting (loading jobs below, checks, boot
        # recovery) must exit cleanly, not by the signal's default action.
        if stop_signals.starting_scheduler():
            stop_signals.for_process()
        # Every process (web and scheduler) needs the same registry, so that the admin
        # and full_clean() can validate job and scope provider names: import each installed
        # app's jobs.py and scopes.py.
        autodiscover_modules("jobs", "scopes")
        # The run log listens to the signals only where LOGGING enables it.
        runlog.follow()
        # Mails the ADMINS of each change of a schedule's need for attention, if asked.
        alert_mail.follow()
        # Outside monitoring, each only where its setting switches it on (docs/monitoring.md):
        # Sentry Crons check-ins, each schedule's ping URL, OpenTelemetry spans.
        sentry.follow()
        pings.follow()
        opentelemetry.follow()
