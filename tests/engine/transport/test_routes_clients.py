"""What redis-py's Cluster clients, which ``routes.py`` builds, do on a real Cluster
(redis-py 8), pinned so that an upgrade that changes it fails here first. The findings
are written up in ``tests/support/TOPOLOGIES.md``; what the Sentinel clients of
``django_distlock/connections.py`` do is pinned in ``tests/test_connections_clients.py``."""

import pytest
import redis.asyncio.cluster
from redis.crc import key_slot
from redis.exceptions import ClusterError

# KEYS[1] - written with ARGV[1]; KEYS[2] - read. Returns the value of KEYS[2].
SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[2])"


def other_primary(cluster, node):
    return next(primary for primary in cluster.primaries if primary is not node)


def test_cluster_evalsha_runs_on_the_primary_of_its_keys(cluster_setup):
    cluster = cluster_setup
    client = cluster.client()
    sha = client.script_load(SCRIPT)
    for primary in cluster.primaries:
        with primary.client() as direct:
            assert direct.script_exists(sha) == [True], "SCRIPT LOAD goes to every primary"
    owner = cluster.node_for_key("{evalsha}:a")
    calls = {primary: primary.command_calls("evalsha") for primary in cluster.primaries}
    client.set("{evalsha}:b", "B")

    assert client.evalsha(sha, 2, "{evalsha}:a", "{evalsha}:b", "A") == b"B"
    assert client.register_script(SCRIPT)(keys=["{evalsha}:a", "{evalsha}:b"], args=["A"]) == b"B"

    for primary in cluster.primaries:
        expected = calls[primary] + (2 if primary is owner else 0)
        assert primary.command_calls("evalsha") == expected
    client.delete("{evalsha}:a", "{evalsha}:b")


async def test_async_cluster_evalsha_runs_on_the_primary_of_its_keys(cluster_setup):
    cluster = cluster_setup
    owner = cluster.node_for_key("{aevalsha}:a")
    before = owner.command_calls("evalsha")
    client = redis.asyncio.cluster.RedisCluster(
        startup_nodes=[
            redis.asyncio.cluster.ClusterNode(node.host, node.port)
            for node in cluster.startup_nodes
        ]
    )
    try:
        sha = await client.script_load(SCRIPT)
        await client.set("{aevalsha}:b", "B")
        assert await client.evalsha(sha, 2, "{aevalsha}:a", "{aevalsha}:b", "A") == b"B"
        assert owner.command_calls("evalsha") == before + 1
        await client.delete("{aevalsha}:a", "{aevalsha}:b")
    finally:
        await client.aclose()


def test_sync_cluster_client_follows_ask_and_moved_for_evalsha(private_cluster):
    cluster = private_cluster
    client = cluster.client()
    sha = client.script_load(SCRIPT)
    client.set("{mig}:a", "A")
    client.set("{mig}:b", "B")
    slot = key_slot(b"{mig}:a")
    target = other_primary(cluster, cluster.primary_for_slot(slot))
    migration = cluster.begin_slot_migration(slot, target)

    migration.move_keys(["{mig}:b"])
    # KEYS[1] still on the source, KEYS[2] already on the target: the server answers
    # TRYAGAIN, which redis-py retries until its TTL (16 attempts) runs out.
    with pytest.raises(ClusterError, match="TTL exhausted"):
        client.evalsha(sha, 2, "{mig}:a", "{mig}:b", "A")

    migration.move_keys()
    asking = target.command_calls("asking")
    assert client.evalsha(sha, 2, "{mig}:a", "{mig}:b", "A1") == b"B"  # ASK
    assert target.command_calls("asking") == asking + 1
    # While the slot is importing, a multi-key command with a key missing on the target
    # gets TRYAGAIN too (Redis and Valkey alike), even when it would create that key.
    with pytest.raises(ClusterError, match="TTL exhausted"):
        client.evalsha(sha, 2, "{mig}:new", "{mig}:b", "N")

    migration.finish()
    assert client.evalsha(sha, 2, "{mig}:new", "{mig}:b", "N") == b"B"  # MOVED
    with target.client() as direct:
        assert direct.mget("{mig}:a", "{mig}:new") == [b"A1", b"N"]
