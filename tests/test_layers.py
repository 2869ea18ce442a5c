"""The package's modules import each other in one direction: no cycles, hidden or not."""

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import django_periodic

PACKAGE = Path(django_periodic.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every django_periodic module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            # "from package import module" imports that module; anything else, the package.
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found |= submodules or {node.module}
    return found & known


# The pure core (DESIGN.md, section 4): the rules and the math, which no model may reach,
# so that they are used, and tested, without the ORM.
PURE_CORE = ("bounds", "choices", "clock", "conf", "policies", "registry", "triggers")


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports."""
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    known = {module_name(p) for p in paths}
    graph = {module_name(p): imported_modules(p, known) - {module_name(p)} for p in paths}
    graph["django_periodic"] = set()  # the package re-exports; its modules import from it
    return graph


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    # Schedule.backfill() is the model's entry point to the backfill module, imported when
    # it is called: the one place a model reaches up a layer.
    graph["django_periodic.models"] -= {"django_periodic.backfill"}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"Import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_public_api_imports_without_the_models():
    code = (
        "import sys; import django_periodic; "
        "from django_periodic import InvalidTrigger, JobContext, UnknownJob, job; "
        "assert 'django_periodic.models' not in sys.modules, 'models imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


@pytest.mark.parametrize("module", PURE_CORE)
def test_the_pure_core_never_reaches_the_models(module):
    graph, reached, todo = import_graph(), set(), [f"django_periodic.{module}"]
    while todo:
        for imported in graph[todo.pop()] - reached:
            reached.add(imported)
            todo.append(imported)
    assert "django_periodic.models" not in reached, sorted(reached)
