"""The shape of the package (docs/architecture.md): no import cycles, an engine that
imports no Django and works without it, the engine's rooms importing only downward, no
module an outlier in length (one concept per module), and a test suite that mirrors the
package (docs/development.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_distlock"
OUTLIER = 900


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes.update(id(child) for statement in node.body for child in ast.walk(statement))
    return nodes


def imports_of(name: str, *, type_only: bool = False) -> set[str]:
    """Every module ``name`` imports at run time (function-local imports included: a
    lazy import that dodges a cycle is still a cycle); with ``type_only``, also those
    imported for type hints alone."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    skipped = set() if type_only else _type_checking_nodes(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def internal_edges(name: str, *, type_only: bool = False) -> set[str]:
    """The package's modules ``name`` depends on (a package's ``__init__`` re-exporting
    its own children is a face, not a dependency)."""
    edges = set()
    for target in imports_of(name, type_only=type_only):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if not target or target == name or name.startswith(target + "."):
            continue
        if MODULES[name].name == "__init__.py" and target.startswith(name + "."):
            continue
        edges.add(target)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycles():
    graph = {name: internal_edges(name) for name in MODULES}
    assert sum(map(len, graph.values())) > 50  # the walk sees the package's imports
    assert cycles(graph) == []


# Django's own shape: a model names its manager, whose queryset builds instances of the
# model (for type hints only).
MODEL_AND_MANAGER = ["django_distlock.managers", "django_distlock.models"]


def test_no_import_cycles_even_for_type_hints():
    graph = {name: internal_edges(name, type_only=True) for name in MODULES}
    assert [cycle for cycle in cycles(graph) if cycle != MODEL_AND_MANAGER] == []


def engine_internals_imported_by(name: str) -> list[str]:
    """The engine's private modules the Django-layer module ``name`` imports (the engine's
    face is ``django_distlock.engine`` and its ``__all__``)."""
    return sorted(
        target
        for target in imports_of(name, type_only=True)
        if target.startswith("django_distlock.engine.") and target in MODULES
    )


def test_the_django_layer_uses_only_the_engines_public_names():
    layer = [name for name in MODULES if not name.startswith("django_distlock.engine")]
    offenders = {name: engine_internals_imported_by(name) for name in layer}
    assert {name: found for name, found in offenders.items() if found} == {}
    # The check sees what it looks for (a name imported from the engine is no module).
    assert "django_distlock.engine.protocol.hold" in engine_internals_imported_by(
        "django_distlock.engine.locks.lock"
    )


def test_no_engine_module_imports_django():
    engine = [name for name in MODULES if name.startswith("django_distlock.engine")]
    assert len(engine) > 10
    offenders = {
        name: sorted(t for t in imports_of(name) if t.split(".")[0] in ("django", "django_redis"))
        for name in engine
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_only_the_metrics_backends_import_their_libraries():
    """The engine, and every module that runs with ``DISTLOCK["METRICS"]`` off, work
    without prometheus_client and opentelemetry (tests/telemetry/test_telemetry.py checks
    that a process with metrics off never imports them)."""
    importers = {
        name: sorted(
            {t.split(".")[0] for t in imports_of(name)} & {"prometheus_client", "opentelemetry"}
        )
        for name in MODULES
    }
    assert {name: found for name, found in importers.items() if found} == {
        "django_distlock.telemetry.prometheus": ["prometheus_client"],
        "django_distlock.telemetry.otel": ["opentelemetry"],
    }


def test_the_engine_imports_where_django_is_not_installed():
    """A finder that refuses Django stands for an environment without it."""
    script = textwrap.dedent(
        """
        import sys

        class NoDjango:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("django", "django_redis"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoDjango())
        import django_distlock.engine as engine
        from django_distlock import LockError

        assert "django" not in sys.modules
        print(len(engine.__all__), LockError.__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    count, name = result.stdout.split()
    assert int(count) > 10
    assert name == "LockError"


# The engine's rooms, bottom to top (docs/architecture.md): a module imports only from its
# own room or from the rooms below it. The leaves are modules of the engine's own folder.
ENGINE = "django_distlock.engine"
ROOMS = [
    {"exceptions", "keys", "tuning", "process", "background", "templates"},
    {"protocol"},
    {"transport"},
    {"listing"},
    {"renewal"},
    {"locks"},
]


def room_of(name: str) -> int:
    """The place in :data:`ROOMS` of the engine module ``name`` (its first part below the
    engine); the engine's own ``__init__``, its face, sits above every room."""
    if name == ENGINE:
        return len(ROOMS)
    first = name[len(ENGINE) + 1 :].split(".")[0]
    found = [level for level, room in enumerate(ROOMS) if first in room]
    assert found, f"{name} is in no room of ROOMS: add it where it belongs"
    return found[0]


def upward_imports(modules: list[str]) -> list[str]:
    """``module -> target`` for each import (type-only ones included) from a room to a
    room above it."""
    found = []
    for name in modules:
        for target in sorted(internal_edges(name, type_only=True)):
            if target.startswith(ENGINE + ".") and room_of(target) > room_of(name):
                found.append(f"{name} -> {target}")
    return found


def test_the_engine_rooms_import_only_downward():
    engine = [name for name in MODULES if name == ENGINE or name.startswith(ENGINE + ".")]
    assert {room_of(name) for name in engine} == set(range(len(ROOMS) + 1))
    assert upward_imports(engine) == []


def test_the_room_check_finds_an_upward_import():
    path = PACKAGE / "engine" / "protocol" / "_probe_for_the_room_test.py"
    path.write_text("from ..locks.lock import Lock\n")
    name = f"{ENGINE}.protocol._probe_for_the_room_test"
    try:
        MODULES[name] = path
        assert upward_imports([name]) == [f"{name} -> {ENGINE}.locks.lock"]
    finally:
        del MODULES[name]
        path.unlink()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_an_outlier_in_length(name):
    """One concept per module; the ceiling only flags an outlier (a module that grew two
    concepts), it is no target to cut by."""
    path = MODULES[name]
    lines = path.read_text().count("\n")
    assert lines <= OUTLIER, (
        f"{path.relative_to(ROOT)} has {lines} lines: does it hold two concepts?"
    )


# -- the tests mirror the package ------------------------------------------------------

TESTS = ROOT / "tests"

NOT_MIRRORING = {
    "support": "the suite's helpers and test apps (no tests)",
    "harness": "the tests of tests/support/",
    "faults": "faults injected into the engine from outside",
    "packaging": "the build, the wheel and tests/run.py",
}
"""The directories of ``tests/`` that mirror no package, and why."""

PROJECT_TESTS = {
    "test_architecture.py": "the package's shape and the suite's",
    "test_docs.py": "the docs' examples, links and install lines",
    "test_demo.py": "the demo project",
    "test_package.py": "the public names, the exceptions' root, models and migrations",
}
"""The modules at the top of ``tests/`` that test the project as a whole, not a module."""


def misplaced_tests(tests: Path, package: Path) -> list[str]:
    """What in ``tests`` does not mirror ``package``: a directory (other than
    :data:`NOT_MIRRORING`) that is not a subpackage at the same path, and a test module at
    the top of ``tests`` (other than :data:`PROJECT_TESTS`) whose name,
    ``test_X.py`` or ``test_X_ASPECT.py``, names no top-level module ``X.py`` (a
    subpackage's tests go in its directory)."""
    found = []
    for directory in sorted(path for path in tests.rglob("*") if path.is_dir()):
        relative = directory.relative_to(tests)
        if relative.parts[0] in NOT_MIRRORING or any(
            part == "__pycache__" or part.startswith(".") for part in relative.parts
        ):
            continue
        if not (package / relative / "__init__.py").is_file():
            found.append(f"tests/{relative.as_posix()}/: no package {package.name}/{relative}/")
    modules = {path.stem for path in package.glob("*.py") if path.name != "__init__.py"}
    for path in sorted(tests.glob("test_*.py")):
        stem = path.stem.removeprefix("test_")
        if path.name in PROJECT_TESTS or any(
            stem == module or stem.startswith(f"{module}_") for module in modules
        ):
            continue
        found.append(f"tests/{path.name}: no module {package.name}/{stem.split('_')[0]}.py")
    return found


def test_the_tests_mirror_the_package():
    """``tests/P/test_X.py`` tests ``django_distlock/P/X.py`` (docs/development.md): a
    new test directory names a subpackage, a new module at the top of ``tests/`` a
    top-level module, or it says in the lists above why it mirrors nothing."""
    assert misplaced_tests(TESTS, PACKAGE) == []
    assert all((TESTS / name).is_dir() for name in NOT_MIRRORING)
    assert all((TESTS / name).is_file() for name in PROJECT_TESTS)


def test_the_mirror_check_finds_what_it_looks_for(tmp_path):
    package = tmp_path / "pkg"
    for folder in ("", "events"):
        (package / folder).mkdir(exist_ok=True)
        (package / folder / "__init__.py").write_text("")
    (package / "locks.py").write_text("")
    tests = tmp_path / "tests"
    for folder in ("events", "layer", "support/anything", "faults", "__pycache__"):
        (tests / folder).mkdir(parents=True)
    for name in (
        "test_locks.py",
        "test_locks_waiting.py",
        "test_docs.py",
        "test_events.py",
        "test_lockstep.py",
        "layer/test_locks.py",
    ):
        (tests / name).write_text("")
    assert misplaced_tests(tests, package) == [
        "tests/layer/: no package pkg/layer/",
        "tests/test_events.py: no module pkg/events.py",
        "tests/test_lockstep.py: no module pkg/lockstep.py",
    ]


# -- redis-py's and asyncio's private names ---------------------------------------------


def _names_defined_in_the_package() -> set[str]:
    """Every ``_name`` the package defines itself: functions, classes, attributes it
    assigns (``self._x = ...``), slots, keyword arguments and module globals."""
    defined: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
                for argument in (
                    (*node.args.args, *node.args.kwonlyargs)
                    if not isinstance(node, ast.ClassDef)
                    else ()
                ):
                    defined.add(argument.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                defined.add(node.value)  # __slots__ entries
    return {name for name in defined if name.startswith("_")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(defined: set[str]) -> list[str]:
    """``module:line: what`` for each private name of another library the package
    reads (an attribute starting with ``_`` that the package never defines itself), and
    each import of a private module (``redis._parsers``)."""
    found = []
    for name, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                attr = node.attr
                if attr.startswith("_") and not attr.startswith("__") and attr not in defined:
                    found.append(f"{name}:{node.lineno}: .{attr}")
            elif isinstance(node, ast.ImportFrom) and not node.level:
                parts = (node.module or "").split(".")
                if any(_private(part) for part in parts) or any(
                    _private(alias.name) for alias in node.names
                ):
                    found.append(f"{name}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{name}:{node.lineno}: import {alias.name}")
    return found


# Underscored names of other libraries that are theirs to promise, none of them redis-py's
# or asyncio's (a static check cannot tell whose object an attribute is read from).
NOT_REDIS_OR_ASYNCIO = {
    "_meta": "Django's documented Model._meta API",
    "_replace": "namedtuple's public method",
    "_state": "Django's model instance state",
    "_chain": "Django's QuerySet copy",
    "_live_receivers": "Django's Signal",
    "_get_current_object": "Celery's task proxy",
}


def test_no_module_reads_a_private_name_of_redis_py_or_asyncio():
    """The package talks to Redis through redis-py's public API only: a private name
    (``connection._parser``, ``parser._buffer``, ``redis._parsers``...) can change in any
    release and silently change which reply a request reads."""
    assert private_uses(_names_defined_in_the_package() | set(NOT_REDIS_OR_ASYNCIO)) == []


def test_the_private_name_check_finds_what_it_looks_for():
    tree_source = "import redis._parsers\nx = connection._parser\nfrom asyncio import _get\n"
    path = PACKAGE / "_probe_for_the_private_name_test.py"
    path.write_text(tree_source)
    try:
        MODULES["django_distlock._probe_for_the_private_name_test"] = path
        found = private_uses(_names_defined_in_the_package() - {"_parser"})
    finally:
        del MODULES["django_distlock._probe_for_the_private_name_test"]
        path.unlink()
    assert [line for line in found if line.startswith("django_distlock._probe")] == [
        "django_distlock._probe_for_the_private_name_test:1: import redis._parsers",
        "django_distlock._probe_for_the_private_name_test:3: from asyncio import ...",
        "django_distlock._probe_for_the_private_name_test:2: ._parser",
    ]
