"""What the suite runs again on a second server (``tests/run.py``'s later passes,
``pytest --server-facing``): the tests whose outcome can differ between servers, and
nothing that would only repeat on Redis 7 what the whole suite showed on Valkey 8.

The rule. A test runs again on another server when what it checks is an answer of the
server itself, that is:

1. **The protocol** (:data:`PROTOCOL`): the engine's tests that send its scripts and
   commands (``EVALSHA`` of the Lua scripts, ``BLPOP``, ``WAIT``, ``PUBLISH``/
   ``SUBSCRIBE``, ``SCAN``, ``INFO``) and read their replies and error replies. Each runs
   once, **on the single server**: its Sentinel and Cluster variants send the same
   scripts to the same kind of server, and what they add (discovery, routing,
   redirects, failover) is client code, or server behaviour that (2) checks. A test
   that talks to no server (pure steps, key layout, input refused before any network
   call) does not run again at all.
2. **The server and its topologies** (:data:`WHOLE`): modules about what a server does
   by itself or as part of a Sentinel or Cluster setup: the harness that starts it
   (flags, config, ``CLUSTER``/``SENTINEL`` commands), redirects and failovers
   (``ASK``, ``MOVED``, ``TRYAGAIN``, ``-UNBLOCKED``, ``READONLY``), replication and
   ``WAIT``, error replies (``OOM``, ``NOREPLICAS``, ``NOPERM``), restarts and what
   expires. Every test of these modules runs again, on its own topology.

Not again: the Django layer (it reaches the server only through the engine), the fault
tests of the client's side (proxies that cut or stall connections, interrupted calls,
forks, renewal lanes), the seeded chaos, caller-fault and mutation runs (randomized
workloads over the commands that (1) and (2) pin; they also test the checker, which
does not depend on the server), and the harness's pure parts (checker, liveness, proxy,
forking). A test added to a module of (1) or (2) is in the pass by that alone; a module
about a new server behaviour goes into :data:`WHOLE`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.support.probe import SINGLE

PROTOCOL = ("tests/engine/",)
"""Directories and modules of (1): their tests that talk to a server, on the single
server."""

WHOLE = (
    "tests/harness/test_redis_servers.py",
    "tests/harness/test_topologies.py",
    "tests/test_connections_clients.py",
    "tests/test_connections_live.py",
    "tests/checks/test_servers.py",
    "tests/test_locks_replica_acknowledgement.py",
    "tests/engine/transport/test_routes_clients.py",
    "tests/engine/transport/test_replication.py",
    "tests/faults/test_topology_faults.py",
    "tests/faults/test_sentinel_unblocked.py",
    "tests/faults/test_failover_fences.py",
    "tests/faults/test_error_replies.py",
    "tests/faults/test_reply_integrity.py",
    "tests/faults/test_server_outages.py",
    "tests/faults/test_memory.py",
    "tests/faults/test_waiting_faults.py",
)
"""Modules of (2), run whole; ``test_waiting_faults.py`` for how the server ends a
``BLPOP`` at its timeout and under hundreds of waiters."""

SERVER_FIXTURES = frozenset(
    {
        "redis_server",
        "private_redis",
        "redis_server_factory",
        "topology",
        "kind_topology",
        "sentinel_setup",
        "private_sentinel",
        "cluster_setup",
        "private_cluster",
        "replicated_setup",
    }
)
"""A test that uses one of these (directly or through ``backend``, ``redis_client`` and
the like) talks to a server."""

TOPOLOGY_PARAMETERS = ("topology", "kind_topology")


def is_server_facing(item: pytest.Item, path: str) -> bool:
    """True if ``item`` (at ``path``, relative to the repository root) runs on the
    second server, by the rule above."""
    if path.startswith(WHOLE):
        return True
    if not path.startswith(PROTOCOL):
        return False
    if not SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    return all(params.get(name, SINGLE) == SINGLE for name in TOPOLOGY_PARAMETERS)


def may_hold_server_facing(path: str) -> bool:
    """False for a test module (``path`` relative to the repository root) that holds no
    server-facing test, so that the pass does not even import it."""
    if not path.endswith(".py") or not path.rpartition("/")[2].startswith("test_"):
        return True
    return path.startswith(WHOLE) or path.startswith(PROTOCOL)


def split(items: Sequence[pytest.Item], root: str) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """``items`` as (server-facing, the others), ``root`` the repository root."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        path = str(item.path.relative_to(root))
        (kept if is_server_facing(item, path) else dropped).append(item)
    return kept, dropped
