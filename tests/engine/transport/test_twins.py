"""The sync and async transport kept in step: every method of a sync class has an async
twin of the same name (``close``/``aclose``) and parameters, and both drivers carry out
the same operations. A difference is allowed only where it is listed here with its
reason."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, get_args

import pytest

from django_distlock.engine.protocol.ops import Op
from django_distlock.engine.transport import drivers, requests, routes

PAIRS = [
    (drivers.SyncDriver, drivers.AsyncDriver),
    (routes.Server, routes.AsyncServer),
    (routes.Routes, routes.AsyncRoutes),
    (routes.ClusterRoutes, routes.AsyncClusterRoutes),
]

FUNCTIONS = [
    (requests.exchange, requests.aexchange),
    (drivers._elsewhere, drivers._aelsewhere),
    (drivers._refresh, drivers._arefresh),
]

SYNC_ONLY = {
    "Server.subscriber": "the force-release subscription is a watchdog thread's (sync)",
    "Routes.ready_for_key": "the sync watchdog asks without I/O; async routes are per loop",
    "ClusterRoutes.ready_for_key": "as Routes.ready_for_key",
    "ClusterRoutes.client": "the sync cluster client is built on first use (slot map I/O)",
}

ASYNC_ONLY = {
    "AsyncDriver._run": "run() without the uncancellable wrapper (completed) around it",
}

PARAMETERS_DIFFER = {
    "SyncDriver.__init__": "an async release runs uncancellable",
    "Routes.__init__": "an async client may be made per loop by the engine (owned)",
    "ClusterRoutes.__init__": "the sync cluster client is made on first use",
    "SyncDriver._scripts_on": "the async twin is bounded by the caller's asyncio.timeout",
    "Server.request": "the async twin is bounded by the caller's asyncio.timeout",
    "Server.bounded_request": "the async twin is bounded by the caller's asyncio.timeout",
    "exchange": "the async twin is bounded by the caller's asyncio.timeout",
}


def own_methods(cls: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(cls).items()
        if inspect.isfunction(value) or isinstance(value, property)
    }


def twin_of(name: str, methods: dict[str, Any]) -> Any:
    if name in methods:
        return methods[name]
    if name.startswith("_"):
        return methods.get(f"_a{name.lstrip('_')}")
    return methods.get(f"a{name}")


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def pair_ids(pair: tuple[type, type]) -> str:
    return pair[0].__name__


@pytest.mark.parametrize("pair", PAIRS, ids=pair_ids)
def test_every_sync_method_has_an_async_twin_with_the_same_parameters(pair):
    sync, asynchronous = pair
    sync_methods, async_methods = own_methods(sync), own_methods(asynchronous)
    problems = []
    for name, method in sync_methods.items():
        key = f"{sync.__name__}.{name}"
        twin = twin_of(name, async_methods)
        if key in SYNC_ONLY:
            assert twin is None, f"{key} is listed as sync-only but has a twin"
            continue
        if twin is None:
            problems.append(f"{key} has no twin in {asynchronous.__name__}")
        elif isinstance(method, property) or isinstance(twin, property):
            if not (isinstance(method, property) and isinstance(twin, property)):
                problems.append(f"{key}: a property on one side only")
        elif key not in PARAMETERS_DIFFER and parameters(method) != parameters(twin):
            problems.append(f"{key}{parameters(method)} != {parameters(twin)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_ids)
def test_every_async_method_has_a_sync_twin(pair):
    sync, asynchronous = pair
    sync_methods = own_methods(sync)
    orphans = [
        name
        for name in own_methods(asynchronous)
        if f"{asynchronous.__name__}.{name}" not in ASYNC_ONLY
        and name not in sync_methods
        and not (name.startswith("a") and name[1:] in sync_methods)
        and not (name.startswith("_a") and f"_{name[2:]}" in sync_methods)
    ]
    assert not orphans, f"{asynchronous.__name__} methods without a sync twin: {orphans}"


@pytest.mark.parametrize("pair", FUNCTIONS, ids=lambda pair: pair[0].__name__)
def test_module_functions_have_twins_with_the_same_parameters(pair):
    sync, asynchronous = pair
    assert inspect.iscoroutinefunction(asynchronous)
    if sync.__name__ not in PARAMETERS_DIFFER:
        assert parameters(sync) == parameters(asynchronous)


def test_the_parameter_allowances_are_still_differences():
    """An allowance that no longer differs is dropped, so the list stays the truth."""
    methods = {
        f"{s.__name__}.{n}": (m, twin_of(n, own_methods(a)))
        for s, a in PAIRS
        for n, m in own_methods(s).items()
    }
    functions = {s.__name__: (s, a) for s, a in FUNCTIONS}
    for key in PARAMETERS_DIFFER:
        sync, twin = methods.get(key) or functions[key]
        assert twin is not None, key
        assert parameters(sync) != parameters(twin), f"{key} no longer differs"


def handled_ops(method: Callable[..., Any]) -> set[str]:
    """The operation types a driver's ``_do`` tests for (``isinstance``/``type(op) is``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            names.add(node.args[1].id)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.Is)
            and isinstance(node.left, ast.Call)
            and getattr(node.left.func, "id", "") == "type"
        ):
            names.add(node.comparators[0].id)
    return names


def test_both_drivers_carry_out_every_operation():
    operations = {op.__name__ for op in get_args(Op)}
    assert operations == {"Call", "StartWait", "AwaitWakeUp", "CallEndingWait", "Pause"}
    assert handled_ops(drivers.SyncDriver._do) == operations
    assert handled_ops(drivers.AsyncDriver._do) == operations
