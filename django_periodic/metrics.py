"""The documented import path of the Prometheus metrics (docs/metrics.md).

The code is an operation's (``django_periodic.operations.metrics``).
"""

from django_periodic.operations.metrics import registry, serve

__all__ = ["registry", "serve"]
