"""The package's layers (docs/contributing.md, "Module map"): each module imports only from
its own layer or those below, and nothing imports in a circle.

From the bottom: the pure core (no models, no SQL), the database plumbing (``db/``), the
models, the engine, operations, and the interface over them all (admin, commands, views,
the public top level). Every import goes down (or stays in its layer), inside functions
too: the models' thin methods reach the engine through ``db.ledger()``, which loads the
engine's operations (``engine/operations.py``) by their path, as Django loads a database
backend. Imports for type checking only (``if TYPE_CHECKING``) run nowhere and are not
counted across the package's layers; for circles they are: a reader, and every import
graph, sees them.

Inside the engine, from the top: the loop (and the models' way in, ``operations``), then
running and planning (``runs``, ``planning``), then the parts they share (``overlap``,
``fleet``, ``batches``, ``tracing``), then the ledger's backends, and at the bottom the
plain records they are all handed (``records``). There every import counts, inside
functions and under ``TYPE_CHECKING`` too: no engine module imports one of a higher
layer, and none imports in a circle. A backend is a leaf: it imports the models, ``db``,
the pure core and the records, nothing else of the engine.
"""

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import django_periodic

PACKAGE = Path(django_periodic.__file__).parent

CORE, DATABASE, MODELS, ENGINE, OPERATIONS, INTERFACE = range(6)
LAYER_NAMES = ("pure core", "database", "models", "engine", "operations", "interface")
# Top-level modules whose code is a lower layer's: the engine's entry point for django.tasks
# (its path is the task's name in every backend).
FACADES = {"tasks": ENGINE}
INTERFACE_MODULES = {"", "admin", "management", "testing", "contrib", "views", "urls", "checks"}
INTERFACE_MODULES |= {"apps"}
# Imports of the machinery one level down: the engine, the admin's and the models' modules,
# and operations but for the documented health and metrics.
PURE_CORE = (
    "choices", "conf", "error_texts", "escaping", "policies", "registry", "scopes", "signals",
    "taskbackends", "timing",
)  # fmt: skip


def layer(module: str) -> int:
    """The layer of a module of the package, by its dotted name."""
    name = module.removeprefix("django_periodic").lstrip(".")
    top = name.split(".")[0]
    if top == "db":
        return DATABASE
    if top == "models":
        return MODELS
    if top == "engine":
        return ENGINE
    if top == "operations":
        return OPERATIONS
    if top in FACADES and name == top:
        return FACADES[top]
    if top in INTERFACE_MODULES:
        return INTERFACE
    assert top in PURE_CORE, f"{module}: which layer? Add it to this test."
    return CORE


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    if isinstance(node, ast.ImportFrom) and node.module:
        # "from package import module" imports that module; anything else, the package.
        submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
        return (submodules or {node.module}) & known
    return set()


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path, known: set[str], type_checking: bool = False) -> tuple[set[str], set[str]]:
    """The package's modules ``path`` imports: (at module level, inside functions); those
    under ``if TYPE_CHECKING`` only if ``type_checking``."""
    at_top, deferred = set(), set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child) and not type_checking:
                continue
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            (deferred if in_function else at_top).update(_imported(child, known))
            visit(child, nested)

    visit(ast.parse(path.read_text()), False)
    return at_top, deferred


def import_graphs(
    type_checking: bool = False,
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Each module and the modules it imports: (at module level, inside functions)."""
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    known = {module_name(p) for p in paths}
    at_top, deferred = {}, {}
    for path in paths:
        name = module_name(path)
        top, inner = imports(path, known, type_checking)
        at_top[name], deferred[name] = top - {name}, inner - {name}
    return at_top, deferred


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({LAYER_NAMES[layer(module)]}) imports {imported} "
        f"({LAYER_NAMES[layer(imported)]})"
        for module, imported_modules in graph.items()
        for imported in imported_modules
        if layer(imported) > layer(module)
    )


def test_module_level_imports_go_down_the_layers():
    at_top, _ = import_graphs()
    assert upward(at_top) == []


def test_imports_inside_functions_go_down_the_layers_too():
    _, deferred = import_graphs()
    assert upward(deferred) == []


def test_no_module_imports_one_that_imports_it_back():
    # Imports for type checking included: the model's mixins name ``ScheduleFields``, never
    # the ``Schedule`` that inherits them.
    at_top, deferred = import_graphs(type_checking=True)
    graph = {module: at_top[module] | deferred[module] for module in at_top}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"Import cycle: {' -> '.join(exc.args[1])}") from None


def test_every_module_has_a_layer():
    at_top, _ = import_graphs()
    for module in at_top:
        layer(module)


def test_the_public_api_imports_without_the_models():
    code = (
        "import sys; import django_periodic; "
        "from django_periodic import InvalidTrigger, JobContext, UnknownJob, job; "
        "assert 'django_periodic.models' not in sys.modules, 'models imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


@pytest.mark.parametrize("module", PURE_CORE)
def test_the_pure_core_never_reaches_the_models(module):
    at_top, deferred = import_graphs()
    reached, todo = set(), [f"django_periodic.{module}"]
    while todo:
        current = todo.pop()
        for imported in (at_top[current] | deferred[current]) - reached:
            reached.add(imported)
            todo.append(imported)
    assert "django_periodic.models" not in reached, sorted(reached)


# The engine's layers (see the module's docstring), by the part under django_periodic.engine;
# a module of the engine's top level not named here is a shared part.
ENGINE_LAYERS = {"": 4, "loop": 4, "operations": 4, "runs": 3, "planning": 3}
ENGINE_LAYERS |= {"backends": 1, "records": 0}
SHARED_ENGINE_LAYER = 2
ENGINE_PACKAGE = "django_periodic.engine"


def engine_layer(module: str) -> int:
    part = module.removeprefix(ENGINE_PACKAGE).lstrip(".").split(".")[0]
    return ENGINE_LAYERS.get(part, SHARED_ENGINE_LAYER)


def every_import(path: Path, known: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere: at module level, inside functions
    and under ``if TYPE_CHECKING``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        found |= _imported(node, known)
    return found


def engine_graph() -> dict[str, set[str]]:
    """Each module of the engine and the package's modules it imports anywhere."""
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    known = {module_name(p) for p in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        if name == ENGINE_PACKAGE or name.startswith(f"{ENGINE_PACKAGE}."):
            graph[name] = every_import(path, known) - {name}
    return graph


def test_inside_the_engine_imports_go_down_its_layers():
    up = sorted(
        f"{module} imports {imported}"
        for module, imported_modules in engine_graph().items()
        for imported in imported_modules
        if imported.startswith(f"{ENGINE_PACKAGE}.")
        and engine_layer(imported) > engine_layer(module)
    )
    assert up == []


def test_no_engine_module_imports_one_that_imports_it_back_type_checking_included():
    graph = engine_graph()
    inside = {module: imported & graph.keys() for module, imported in graph.items()}
    try:
        TopologicalSorter(inside).prepare()
    except CycleError as exc:
        raise AssertionError(f"Import cycle: {' -> '.join(exc.args[1])}") from None


def test_a_backend_imports_only_the_models_db_the_pure_core_and_the_records():
    outside = sorted(
        f"{module} imports {imported}"
        for module, imported_modules in engine_graph().items()
        if module.startswith(f"{ENGINE_PACKAGE}.backends")
        for imported in imported_modules
        if layer(imported) > MODELS
        and not imported.startswith((f"{ENGINE_PACKAGE}.backends", f"{ENGINE_PACKAGE}.records"))
    )
    assert outside == []
