"""The public API is a short list, each name of it documented in docs/api.md.

A name added to ``__all__`` of ``django_periodic`` or ``django_periodic.models`` must be
added here and to docs/api.md; the engine's own names stay in the modules that define them.
"""

import importlib
import re
from pathlib import Path

import pytest

import django_periodic
from django_periodic import models

DOCS = Path(__file__).resolve().parent.parent / "docs"
API_MD = (DOCS / "api.md").read_text()

PUBLIC = {
    django_periodic: ["InvalidTrigger", "JobContext", "UnknownJob", "job"],
    models: [
        "UNTIL_RESUMED",
        "Calendar",
        "ConcurrencyLimit",
        "ExplainPage",
        "FireAccount",
        "FireOverride",
        "FireStatus",
        "Lease",
        "LeaseQuerySet",
        "LimitVersion",
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


# The modules a doc may import from, and its submodules it may import as modules.
DOC_MODULES = {
    "django_periodic",
    "django_periodic.contrib",
    "django_periodic.contrib.opentelemetry",
    "django_periodic.contrib.sentry",
    "django_periodic.models",
    "django_periodic.scopes",
    "django_periodic.signals",
    "django_periodic.testing",
    "django_periodic.views",
}
DOC_PAGES = sorted([*DOCS.glob("*.md"), DOCS.parent / "README.md"])
# A line of code, shown (a doctest's prompt or not) or hidden (a MyST comment, "% ").
LINE = r"^(?:% |>>> |\.\.\. )?\s*"
# "from M import a, b as c", or its names in parentheses over several lines.
IMPORT = re.compile(LINE + r"from (django_periodic[\w.]*) import (\([^)]*\)|[\w, ]+)", re.M)
# "import M" or "import M as x": M itself must be public.
MODULE_IMPORT = re.compile(LINE + r"import (django_periodic[\w.]*)", re.M)
# What a line of names in parentheses may carry besides them: a prompt, a comment.
NOISE = re.compile(r"^\s*(?:% |\.\.\. )|#.*$", re.M)


def doc_imports() -> list[tuple[str, str, str]]:
    found = []
    for path in DOC_PAGES:
        text = path.read_text()
        for module, names in IMPORT.findall(text):
            for name in NOISE.sub("", names).strip("()").split(","):
                if name.strip():
                    found.append((path.name, module, name.split(" as ")[0].strip()))
        for module in MODULE_IMPORT.findall(text):
            parent, _, name = module.rpartition(".")
            found.append((path.name, parent or module, name if parent else ""))
    return found


@pytest.mark.parametrize(("page", "module", "name"), doc_imports())
def test_the_docs_import_public_names_only(page, module, name):
    """Each name a page imports is a public module, or a name of a public module that its
    ``__all__`` or docs/api.md lists."""
    assert module in DOC_MODULES, f"{page} imports from the private module {module}"
    if not name or f"{module}.{name}" in DOC_MODULES:
        return
    listed = getattr(importlib.import_module(module), "__all__", None)
    documented = re.search(rf"\.\. \w+:: {re.escape(module)}\.{name}\b", API_MD)
    assert (listed is not None and name in listed) or documented, f"{page}: {module}.{name}"
