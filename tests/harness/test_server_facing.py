"""The selection of the second server's pass (``tests/support/server_facing.py``,
``pytest --server-facing``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import REPO_ROOT
from tests.support.server_facing import PROTOCOL, WHOLE, is_server_facing, may_hold_server_facing


@dataclass
class CallSpec:
    params: dict[str, Any]


@dataclass
class Item:
    """What the selection reads of a pytest item."""

    fixturenames: list[str]
    callspec: CallSpec | None = None


def on(topology: str, *fixtures: str) -> Item:
    return Item(["backend", "topology", *fixtures], CallSpec({"topology": topology}))


def test_every_module_it_names_exists():
    """A module renamed or moved would silently leave the pass."""
    for path in (*PROTOCOL, *WHOLE):
        assert (REPO_ROOT / path).exists(), path


@pytest.mark.parametrize(("topology", "runs"), [("single", True), ("sentinel", False)])
def test_a_protocol_test_runs_on_the_single_server_only(topology, runs):
    assert is_server_facing(on(topology), "tests/engine/locks/test_lock.py") is runs
    assert not is_server_facing(on("cluster"), "tests/engine/locks/test_lock.py")


def test_a_process_test_on_the_single_server_runs_and_on_the_cluster_does_not():
    single = Item(["kind_topology"], CallSpec({"kind_topology": "single"}))
    cluster = Item(["kind_topology"], CallSpec({"kind_topology": "cluster"}))
    assert is_server_facing(single, "tests/engine/locks/test_lock_kinds_processes.py")
    assert not is_server_facing(cluster, "tests/engine/locks/test_lock_kinds_processes.py")


def test_a_protocol_test_written_for_one_topology_runs_as_it_is():
    assert is_server_facing(Item(["cluster_setup"]), "tests/engine/listing/test_query.py")


def test_an_engine_test_that_talks_to_no_server_does_not_run_again():
    assert not is_server_facing(Item(["dead_backend", "api"]), "tests/engine/locks/test_lock.py")
    assert not is_server_facing(Item([]), "tests/engine/test_keys.py")


def test_a_module_about_the_server_runs_whole_on_every_topology():
    assert is_server_facing(on("cluster"), "tests/engine/transport/test_replication.py")
    assert is_server_facing(Item([]), "tests/harness/test_redis_servers.py")


@pytest.mark.parametrize(
    "path",
    [
        "tests/test_locks.py",
        "tests/views/test_views.py",
        "tests/faults/test_chaos.py",
        "tests/faults/test_watchdog_isolation.py",
        "tests/harness/test_checker.py",
    ],
)
def test_the_django_layer_chaos_and_client_side_faults_do_not_run_again(path):
    assert not is_server_facing(on("single"), path)
    assert not may_hold_server_facing(path)


def test_directories_and_support_modules_are_always_collected():
    assert may_hold_server_facing("tests/views")
    assert may_hold_server_facing("tests/conftest.py")
    assert may_hold_server_facing("tests/engine/locks/test_lock.py")
