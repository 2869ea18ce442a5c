"""Mailing the ``ADMINS`` when a schedule begins or ends needing attention, when the
``ALERT_MAIL_ADMINS`` setting is on.

A receiver of ``schedule_needs_attention`` and ``schedule_recovered``, connected at start
(``follow()``) and reading the setting when a change is announced: changes are rare, and
each is announced once, by the one scheduler that wrote it (engine/attention.py).
"""

from typing import Any

from django.core.mail import mail_admins

from django_periodic import signals
from django_periodic.conf import get_settings


def subject(signal: Any, schedule: str, message: str) -> str:
    """The mail's subject (Django prefixes EMAIL_SUBJECT_PREFIX)."""
    if signal is signals.schedule_recovered:
        return f"Schedule {schedule!r} recovered"
    return f"Schedule {schedule!r} needs attention: {message}"


def _mail(signal: Any, schedule: str, message: str, since: Any, using: str, **kwargs: Any) -> None:
    if not get_settings().ALERT_MAIL_ADMINS:
        return
    began = f"{since:%Y-%m-%d %H:%M:%S} UTC"
    if signal is signals.schedule_recovered:
        body = f"Schedule {schedule!r} no longer needs attention (since {began}: {message})."
    else:
        body = f"Schedule {schedule!r} needs attention since {began}: {message}."
    # A mail server that fails must not fail the scheduler that announced the change.
    mail_admins(subject(signal, schedule, message), body, fail_silently=True)


def follow() -> None:
    """Connect the receiver (once: connecting again replaces it)."""
    for signal in (signals.schedule_needs_attention, signals.schedule_recovered):
        signal.connect(_mail, dispatch_uid="django_periodic.alert_mail", weak=False)
