"""The package's shape stays readable (docs/contributing.md, "Module map"): small folders,
short modules, a small top level, one place that asks which database an alias is, and a
pure core that runs no SQL."""

import ast
from pathlib import Path

import pytest

import django_periodic

PACKAGE = Path(django_periodic.__file__).parent
# Django's convention, one file per schema change, not ours to group.
NOT_COUNTED = {"migrations"}
MODULES = [p for p in PACKAGE.rglob("*.py") if not NOT_COUNTED & set(p.parts)]
MOST_MODULES_IN_A_FOLDER = 15
MOST_LINES_IN_A_MODULE = 500
# A module under this many lines belongs in its neighbour, but for a few (the module map
# says why each stands alone) and the entry points whose paths Django or the docs fix.
FEWEST_LINES_IN_A_MODULE = 40
MOST_SHORT_MODULES = 3
FIXED_PATHS = {"apps.py", "urls.py", "views.py", "contrib/health_check.py"}
FIXED_PATHS |= {"testing/pytest_plugin.py"}
MOST_TOP_LEVEL_MODULES = 16
# The modules of the pure core (tests/test_layers.py), which must not touch the database.
PURE_CORE = ("choices", "conf", "error_texts", "escaping", "policies", "registry", "scopes")
PURE_CORE += ("signals", "taskbackends", "timing")
DATABASE_ACCESS = {"connection", "connections", "transaction", "cursor", "on_commit"}
DATABASE_ACCESS |= {"OperationalError", "InterfaceError"}


def relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_no_folder_holds_more_than_15_modules():
    folders: dict[Path, int] = {}
    for path in MODULES:
        folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {relative(f): n for f, n in folders.items() if n > MOST_MODULES_IN_A_FOLDER}
    assert crowded == {}


def test_no_module_is_over_500_lines():
    # Grouped by concept, not by size: a cohesive module may reach 500 lines.
    lines = {relative(p): len(p.read_text().splitlines()) for p in MODULES}
    long = {path: n for path, n in lines.items() if n > MOST_LINES_IN_A_MODULE}
    assert long == {}


def test_short_modules_are_folded_into_their_neighbours():
    lines = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in MODULES
        if path.name != "__init__.py"
    }
    short = {
        path: n
        for path, n in lines.items()
        if n < FEWEST_LINES_IN_A_MODULE and path not in FIXED_PATHS
    }
    assert len(short) <= MOST_SHORT_MODULES, short


def test_the_top_level_has_at_most_16_modules():
    assert len(list(PACKAGE.glob("*.py"))) <= MOST_TOP_LEVEL_MODULES


def test_only_db_asks_which_database_an_alias_is():
    asking = [
        f"{relative(path)}:{number}"
        for path in MODULES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ".vendor" in line
    ]
    assert [place.split(":")[0] for place in asking] == ["django_periodic/db/__init__.py"]


def _names_used(path: Path) -> set[str]:
    """Every name the module's code uses or imports (not its strings and comments)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
    return names


@pytest.mark.parametrize("module", PURE_CORE)
def test_the_pure_core_runs_no_sql(module):
    paths = [PACKAGE / f"{module}.py"] if (PACKAGE / f"{module}.py").exists() else []
    paths += sorted((PACKAGE / module).glob("*.py"))
    assert paths, module
    touching = {relative(p): sorted(DATABASE_ACCESS & _names_used(p)) for p in paths}
    assert {path: names for path, names in touching.items() if names} == {}
