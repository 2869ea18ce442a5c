"""The smoke test's job, found like any app's jobs.py (django_periodic imports them at startup)."""

from django_periodic import job


@job
def echo(text: str) -> dict[str, str]:
    """Return its argument, so the test can see the run's result came from this code."""
    return {"echo": text}
