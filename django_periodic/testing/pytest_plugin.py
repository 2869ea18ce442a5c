"""pytest fixtures for testing jobs: enable with ``pytest_plugins =
["django_periodic.testing.pytest_plugin"]`` in your top-level ``conftest.py`` (or
``-p django_periodic.testing.pytest_plugin``). Needs pytest-django (its ``db`` fixture).

Only this module imports pytest; ``django_periodic.testing`` itself does not.
"""

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_periodic.models import Run


@pytest.fixture
def periodic_run_due(db: None) -> Callable[..., "list[Run]"]:
    """``django_periodic.testing.run_due``, with the test's database enabled."""
    from django_periodic.testing import run_due

    return run_due


@pytest.fixture
def periodic_now(db: None) -> datetime:
    """The database's clock when the test started: a ``now`` to pass to ``run_due``, and to
    compute later ones from (``periodic_now + timedelta(minutes=5)``)."""
    from django_periodic.db import clock

    return clock.now()
