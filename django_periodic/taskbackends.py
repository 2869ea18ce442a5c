"""Django's tasks framework on either Django version, and the backends of its ``TASKS``.

No model is imported here: the models validate ``Schedule.tasks_backend`` with it.
"""

import importlib
from types import ModuleType

INSTALL_HINT = (
    "Handing runs to a tasks backend needs Django's tasks framework: Django 6 or later "
    "(django.tasks), or on Django 5.2 the backport: pip install 'django-periodic[tasks]'."
)


class TasksUnavailable(ImportError):
    pass


def framework() -> ModuleType:
    """``django.tasks`` (Django 6), else the ``django_tasks`` backport (Django 5.2).
    Raises TasksUnavailable if neither is installed."""
    for name in ("django.tasks", "django_tasks"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise TasksUnavailable(INSTALL_HINT)


def aliases() -> list[str]:
    """The aliases of Django's ``TASKS`` setting (its default backend when unset)."""
    return list(framework().task_backends.settings)


def alias_error(alias: str) -> str | None:
    """Why runs cannot be handed to backend ``alias``, or None if they can."""
    try:
        known = aliases()
    except TasksUnavailable:
        return f"{alias!r} needs Django's tasks framework, which is not installed. {INSTALL_HINT}"
    if alias not in known:
        listed = ", ".join(repr(name) for name in known)
        return f"{alias!r} is not a backend of the TASKS setting (it has {listed})."
    return None
