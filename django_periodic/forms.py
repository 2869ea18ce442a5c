"""Admin forms: the job is picked from the registry, so a typo cannot reach the database."""

from django import forms

from django_periodic import registry
from django_periodic.models import Schedule


def job_choices() -> list[tuple[str, str]]:
    jobs = sorted(registry.registered_jobs().values(), key=lambda j: j.name)
    return [("", "---------")] + [
        (j.name, f"{j.name} — {j.description}" if j.description else j.name) for j in jobs
    ]


class ScheduleForm(forms.ModelForm):
    job = forms.ChoiceField(choices=job_choices, help_text="A function registered with @job.")

    class Meta:
        model = Schedule
        fields = [
            "name",
            "job",
            "args",
            "kwargs",
            "enabled",
            "cron",
            "timezone",
            "interval",
            "run_at",
            "start_at",
            "end_at",
            "overlap",
            "misfire",
            "misfire_grace",
            "max_attempts",
            "retry_backoff",
            "timeout",
            "lease_timeout",
            "allow_stale_reentry",
        ]
