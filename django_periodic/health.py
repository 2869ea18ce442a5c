"""The documented import path of the health report (docs/commands.md, "periodic_status").

The code is an operation's (``django_periodic.operations.health``).
"""

from django_periodic.operations.health import Lag, Problem, Report, attention, gather

__all__ = ["Lag", "Problem", "Report", "attention", "gather"]
