"""Mailing the ``ADMINS`` when schedules begin or end needing attention, when the
``ALERT_MAIL_ADMINS`` setting is on.

A receiver of ``schedule_needs_attention`` and ``schedule_recovered``, connected at start
(``follow()``) and reading the setting when a change is announced. It runs on the thread
that announced the change, the scheduler's loop, so it only posts a notice to the outbox
(alert_outbox.py): the outbox's own thread mails the changes of one ``ALERT_INTERVAL``
together, with a timeout on the mail server, and a server that never answers never holds
up the loop.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django
from django.conf import settings
from django.core.mail import get_connection, mail_admins

from django_periodic import signals
from django_periodic.conf import get_settings
from django_periodic.operations.alert_outbox import SIZE, Outbox, Untold

# Seconds the mail server may take to answer, unless Django's EMAIL_TIMEOUT says (Django
# waits forever by default).
DEFAULT_TIMEOUT = 10.0
# The mailer of ``MAILERS`` (Django 6.1+) that Django's own mail_admins() uses by default.
DEFAULT_MAILER = "default"


@dataclass(frozen=True)
class Notice:
    """One change to mail: ``schedule`` began needing attention, or ``recovered``."""

    schedule: str
    message: str
    since: datetime
    recovered: bool = False

    def line(self) -> str:
        began = f"{self.since:%Y-%m-%d %H:%M:%S} UTC"
        if self.recovered:
            return (
                f"Schedule {self.schedule!r} no longer needs attention "
                f"(since {began}: {self.message})."
            )
        return f"Schedule {self.schedule!r} needs attention since {began}: {self.message}."


def subject(notices: Sequence[Notice]) -> str:
    """The mail's subject (Django prefixes EMAIL_SUBJECT_PREFIX)."""
    if len(notices) == 1:
        (notice,) = notices
        if notice.recovered:
            return f"Schedule {notice.schedule!r} recovered"
        return f"Schedule {notice.schedule!r} needs attention: {notice.message}"
    recovered = sum(notice.recovered for notice in notices)
    began = len(notices) - recovered
    parts = [f"{began} schedule(s) need attention"] if began else []
    parts += [f"{recovered} recovered"] if recovered else []
    return ", ".join(parts)


def body(notices: Sequence[Notice], untold: Untold) -> str:
    """The mail's text: a line per change, then what earlier mails could not tell."""
    lines = [notice.line() for notice in notices]
    if untold.dropped:
        lines.append(
            f"\n{untold.dropped} more change(s) are not listed: one mail lists {SIZE} at most."
        )
    if untold.unsent:
        lines.append(
            f"\n{untold.unsent} earlier change(s) were not mailed: the mail server failed "
            "(the scheduler's log says why)."
        )
    if untold:
        lines.append("`manage.py periodic_status` lists every schedule that needs attention.")
    return "\n".join(lines)


def timeout() -> float:
    """How long the mail server may take: Django's EMAIL_TIMEOUT, else ours."""
    configured = getattr(settings, "EMAIL_TIMEOUT", None)
    return DEFAULT_TIMEOUT if configured is None else float(configured)


def send(notices: list[Notice], untold: Untold) -> None:
    """Mail the changes gathered to the ADMINS (the outbox's thread calls it): through
    Django's default mailer where ``MAILERS`` is set (Django 6.1+), as Django's own error
    mails are, with its ``timeout`` option; else through a connection with ``timeout()``."""
    if uses_mailers():
        mail_admins(subject(notices), body(notices, untold), using=DEFAULT_MAILER)
    else:
        connection = get_connection(timeout=timeout())
        mail_admins(subject(notices), body(notices, untold), connection=connection)


def uses_mailers() -> bool:
    """The project configures ``MAILERS`` (Django 6.1+), which replace the ``EMAIL_*``
    settings and ``get_connection()``; earlier versions ignore the setting."""
    return django.VERSION >= (6, 1) and hasattr(settings, "MAILERS")


def interval_seconds() -> float:
    """The ALERT_INTERVAL, the least time between two mails."""
    return get_settings().ALERT_INTERVAL.total_seconds()


outbox: Outbox[Notice] = Outbox(send, interval_seconds)


def _post(signal: Any, schedule: str, message: str, since: datetime, **kwargs: Any) -> None:
    if get_settings().ALERT_MAIL_ADMINS:
        outbox.post(Notice(schedule, message, since, signal is signals.schedule_recovered))


def follow() -> None:
    """Connect the receiver (once: connecting again replaces it)."""
    for signal in (signals.schedule_needs_attention, signals.schedule_recovered):
        signal.connect(_post, dispatch_uid="django_periodic.alert_mail", weak=False)
