"""What the docs promise about recovery, removed jobs and start times holds the code's own numbers.

The recovery window and the grace of a removed job are quoted on several pages; each figure
is worked out here from the defaults the code has, so that changing a default without its
pages fails. How fast a killed process is detected is the crash suite's to show
(tests/test_presence.py: its runs settled before their leases expire).
"""

import re
from datetime import timedelta
from pathlib import Path

import pytest

from django_periodic.choices import KIND_FIELDS
from django_periodic.conf import PeriodicSettings
from django_periodic.models import Schedule
from django_periodic.models.schedule_fields import SCHEDULE_OPTIONS

DOCS = Path(__file__).resolve().parent.parent / "docs"
# What a user reads: the pages and the README.
USER_DOCS = sorted([*DOCS.glob("*.md"), DOCS.parent / "README.md"])
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


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda path: path.name)
def test_no_page_adds_a_sweep_interval_to_recovery(path):
    """The sweep runs at the earliest expiry, whatever ``SWEEP_INTERVAL`` says."""
    text = re.sub(r"\s+", " ", path.read_text())
    assert not re.search(r"lease_timeout`? *\+ *`?SWEEP_INTERVAL", text)
    assert "~40 s" not in text


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda path: path.name)
def test_no_page_promises_a_start_to_the_millisecond(path):
    """A run is released at its plan time, never before, and starts after it by the
    scheduler's lag: tens of milliseconds, more under load (docs/performance.md)."""
    text = re.sub(r"\s+", " ", path.read_text())
    assert not re.search(r"to the millisecond|millisecond[- ]precise|to the ms\b", text, re.I)


# An override written with the ORM: created, updated or deleted past skip_fire(),
# move_fire() and clear_override().
ORM_OVERRIDE = re.compile(
    r"(?:FireOverride\.objects|\.overrides)\.(?:\w*create|update|delete)\("
    r"|FireOverride\(.*?\)\.save\("
)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda path: path.name)
def test_no_example_writes_an_override_with_the_orm(path):
    """docs/overrides.md: only the schedule's methods validate an override, move the
    cursor and change a run already planned."""
    assert ORM_OVERRIDE.findall(path.read_text()) == []


def test_a_removed_job_is_not_said_to_be_a_planning_failure():
    minutes = seconds(DEFAULTS.UNKNOWN_JOB_GRACE) // 60
    comparison = page("comparison.md")
    assert f"`UNKNOWN_JOB_GRACE` ({minutes} min)" in comparison
    assert f"`PLANNING_FAILURE_LIMIT` ({DEFAULTS.PLANNING_FAILURE_LIMIT})" in comparison
    for path in USER_DOCS:
        text = re.sub(r"\s+", " ", path.read_text())
        assert not re.search(r"disabled after 3 (ticks|failures)", text), path.name


def test_the_guide_names_every_kind_of_trigger():
    """Validation takes one trigger of every kind ``KIND_FIELDS`` names, ``after`` too."""
    guide = page("guide.md")
    sentence = re.search(r"Exactly one trigger must be set:(.*?)\.(?: |$)", guide)
    assert sentence, "guide.md no longer says which triggers a schedule takes"
    assert sorted(re.findall(r"`(\w+)`", sentence[1])) == sorted(KIND_FIELDS.values())


def test_the_guide_names_every_field_of_a_schedule():
    """The guide's schedule table and its read-only fields: a new field is documented with
    its model."""
    guide = page("guide.md")
    section = guide[guide.index("## Schedules") :]
    fields = [f.name for f in Schedule._meta.get_fields() if f.concrete or f.many_to_many]
    missing = [name for name in fields if name != "id" and f"`{name}`" not in section]
    assert missing == []


def test_the_guide_names_the_fields_job_cannot_set():
    """``@job(...)`` takes every field a user may set on a schedule but those the guide
    names (its read-only fields aside)."""
    guide = page("guide.md")
    sentence = re.search(
        r"any other field of the \[schedule table\]\(#schedules\) but (.*?) \(", guide
    )
    assert sentence, "guide.md no longer says which fields @job(...) cannot set"
    editable = {
        f.name for f in Schedule._meta.get_fields() if (f.concrete or f.many_to_many) and f.editable
    }
    named = re.findall(r"`(\w+)`", sentence[1])
    assert sorted(named) == sorted(editable - SCHEDULE_OPTIONS - {"id"})


def guide_defaults() -> dict[str, str]:
    """The guide's schedule table: each field named in a row's first cell, with the default
    the second cell gives it (a cell of several fields gives one default each, or one for
    all)."""
    guide = (DOCS / "guide.md").read_text()
    section = guide[guide.index("## Schedules") :]
    defaults = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        values = [value.strip() for value in cells[1].split(",")]
        values = values if len(values) == len(names) else [cells[1]] * len(names)
        defaults.update(zip(names, values, strict=True))
    return defaults


def in_words(value: object) -> str:
    """A model default as the guide writes it."""
    if value is None:
        return "`None`"
    if isinstance(value, bool | list | dict):
        return f"`{value!r}`".replace("'", '"')
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, timedelta):
        for unit, length in (("hour", 3600), ("minute", 60), ("second", 1)):
            count, rest = divmod(seconds(value), length)
            if rest == 0:
                return f"{count} {unit}" + "s" * (count != 1)
    return str(value)


@pytest.mark.parametrize("name", sorted(guide_defaults()))
def test_the_guide_gives_each_field_its_model_default(name):
    field = Schedule._meta.get_field(name)
    written = guide_defaults()[name]
    if written in ("(required)", "`settings.TIME_ZONE`", "none"):
        return  # no default of its own: the name, the job, the time zone, the calendars
    default = field.get_default() if field.has_default() else None
    default = list(default) if isinstance(default, list | tuple) else default
    assert written == in_words(default), f"{name}: the guide says {written}"


# A commit's abbreviated or full hash: hex with a letter and a digit, not part of a UUID.
COMMIT_HASH = re.compile(r"(?<![-\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![-\w])")
# Code (fenced blocks and inline spans): its hex is an example's value, not a commit.
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda path: path.name)
def test_user_docs_name_no_commit(path):
    # The docs state what is true now; git keeps which commit made it so.
    prose = CODE.sub("", path.read_text())
    assert COMMIT_HASH.findall(prose) == []
