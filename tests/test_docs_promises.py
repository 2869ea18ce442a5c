"""What the docs promise about recovery and removed jobs holds the code's own numbers.

The recovery window and the grace of a removed job are quoted on several pages; each figure
is worked out here from the defaults the code has, so that changing a default without its
pages fails. How fast a killed process is detected is the crash suite's to show
(tests/test_presence.py: its runs settled before their leases expire).
"""

import re
from datetime import timedelta
from pathlib import Path

import pytest

from django_periodic.conf import PeriodicSettings
from django_periodic.models import Schedule

DOCS = Path(__file__).resolve().parent.parent / "docs"
DEFAULTS = PeriodicSettings()
LEASE_TIMEOUT: timedelta = Schedule._meta.get_field("lease_timeout").default


def page(name: str) -> str:
    # One line per paragraph's worth of wrapping: a phrase may be split across lines.
    return re.sub(r"\s+", " ", (DOCS / name).read_text())


def seconds(value: timedelta) -> int:
    return int(value.total_seconds())


def test_the_recovery_window_by_expiry_is_the_defaults_own():
    """Settled when the lease expires: between one heartbeat interval short of
    ``lease_timeout`` and ``lease_timeout`` after the process stopped."""
    latest = seconds(LEASE_TIMEOUT)
    earliest = latest - seconds(DEFAULTS.HEARTBEAT_INTERVAL)
    assert f"{earliest} to {latest} seconds after the process stopped" in page("semantics.md")
    assert f"{earliest} to {latest} s after the kill" in page("semantics.md")
    assert f"{earliest}-{latest} s where only the lease tells" in page("comparison.md")
    assert f"`lease_timeout` ({latest} s)" in page("comparison.md")


@pytest.mark.parametrize("name", sorted(p.name for p in DOCS.glob("*.md")))
def test_no_page_adds_a_sweep_interval_to_recovery(name):
    """The sweep runs at the earliest expiry, whatever ``SWEEP_INTERVAL`` says."""
    text = page(name)
    assert not re.search(r"lease_timeout`? *\+ *`?SWEEP_INTERVAL", text)
    assert "~40 s" not in text


def test_a_removed_job_is_not_said_to_be_a_planning_failure():
    minutes = seconds(DEFAULTS.UNKNOWN_JOB_GRACE) // 60
    comparison = page("comparison.md")
    assert f"`UNKNOWN_JOB_GRACE` ({minutes} min)" in comparison
    assert f"`PLANNING_FAILURE_LIMIT` ({DEFAULTS.PLANNING_FAILURE_LIMIT})" in comparison
    for name in ("comparison.md", "semantics.md"):
        assert not re.search(r"disabled after 3 (ticks|failures)", page(name))


def test_the_guide_names_every_field_of_a_schedule():
    """The guide's schedule table and its read-only fields: a new field is documented with
    its model."""
    guide = page("guide.md")
    section = guide[guide.index("## Schedules") :]
    fields = [f.name for f in Schedule._meta.get_fields() if f.concrete or f.many_to_many]
    missing = [name for name in fields if name != "id" and f"`{name}`" not in section]
    assert missing == []
