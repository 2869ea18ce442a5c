"""The public API is a short list, each name of it documented in docs/api.md.

A name added to ``__all__`` of ``django_periodic`` or ``django_periodic.models`` must be
added here and to docs/api.md; the engine's own names stay in the modules that define them.
"""

import re
from pathlib import Path

import pytest

import django_periodic
from django_periodic import models

API_MD = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()

PUBLIC = {
    django_periodic: ["InvalidTrigger", "JobContext", "UnknownJob", "job"],
    models: [
        "UNTIL_RESUMED",
        "Calendar",
        "ExplainPage",
        "FireAccount",
        "FireOverride",
        "FireStatus",
        "Lease",
        "LeaseQuerySet",
        "Run",
        "RunQuerySet",
        "Schedule",
        "ScheduleQuerySet",
        "ScheduleVersion",
        "SchedulerProcess",
        "SchedulerProcessQuerySet",
        "changed_by",
        "restore_version",
    ],
}


@pytest.mark.parametrize("module", PUBLIC, ids=lambda module: module.__name__)
def test_the_public_names_are_these(module):
    assert sorted(module.__all__) == sorted(PUBLIC[module])


@pytest.mark.parametrize(
    "name", [f"{m.__name__}.{name}" for m, names in PUBLIC.items() for name in names]
)
def test_each_public_name_is_documented(name):
    assert re.search(rf"\.\. \w+:: {re.escape(name)}\b", API_MD), f"{name} not in docs/api.md"


def test_the_models_module_stays_small():
    assert len(models.__all__) <= 20
