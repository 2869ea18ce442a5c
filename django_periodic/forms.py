"""Admin forms: the job is picked from the registry, so a typo cannot reach the database."""

from django import forms

from django_periodic import registry
from django_periodic.models import Schedule
from django_periodic.registry import JOB_FIELDS, POLICY_FIELDS, TRIGGER_FIELDS


def job_choices() -> list[tuple[str, str]]:
    jobs = sorted(registry.registered_jobs().values(), key=lambda j: j.name)
    return [("", "---------")] + [
        (j.name, f"{j.name} — {j.description}" if j.description else j.name) for j in jobs
    ]


class ScheduleForm(forms.ModelForm):
    job = forms.ChoiceField(choices=job_choices, help_text="A function registered with @job.")

    class Meta:
        model = Schedule
        fields = ["name", "job", *JOB_FIELDS, "enabled", *TRIGGER_FIELDS, *POLICY_FIELDS]
