"""Sentry Crons: a monitor per schedule, and check-ins for each run (``SENTRY_CRONS``).

Switched on by ``DJANGO_PERIODIC["SENTRY_CRONS"] = True``, with sentry-sdk installed (the
``sentry`` extra) and initialised by the project (``sentry_sdk.init()``). Off, nothing
listens to the signals and nothing of sentry-sdk is imported. See docs/sentry.md.
"""

from importlib.util import find_spec
from typing import Any

from django.core.signals import setting_changed

from django_periodic.conf import SETTING_NAME, get_settings
from django_periodic.contrib.sentry.monitors import monitor_config, monitor_slug

__all__ = ["flush", "follow", "installed", "monitor_config", "monitor_slug"]

MISSING = "sentry-sdk is not installed: install django-periodic[sentry] (pip install sentry-sdk)."
_UID = "django_periodic.contrib.sentry"


def installed() -> bool:
    """Whether sentry-sdk can be imported."""
    return find_spec("sentry_sdk") is not None


def follow() -> bool:
    """Connect the check-ins' receivers if ``SENTRY_CRONS`` is on and sentry-sdk installed,
    disconnect them otherwise; return whether they are connected."""
    on = get_settings().SENTRY_CRONS and installed()
    if on:
        from django_periodic.contrib.sentry import checkins

        for signal, receiver in checkins.RECEIVERS.items():
            signal.connect(receiver, weak=False, dispatch_uid=_UID)
        checkins.forget()
    else:
        from django_periodic import signals

        for signal in signals.RUN_SIGNALS:
            signal.disconnect(dispatch_uid=_UID)
    return on


def flush(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the check-ins queued by this process to be handed
    to sentry-sdk; True if they were (then ``sentry_sdk.flush()`` sends them)."""
    if not installed():
        return True
    from django_periodic.contrib.sentry import checkins

    return checkins.SENDER.flush(timeout)


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        follow()


setting_changed.connect(_settings_changed, dispatch_uid=_UID)
