"""What the clients we build on do on real Sentinel and Cluster topologies (redis-py 8,
django-redis 7), pinned so that an upgrade that changes it fails here first. The
findings are written up in ``tests/support/TOPOLOGIES.md``."""

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
from django.core.cache import caches
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ClusterError
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

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


def test_master_for_gives_a_sentinel_pool_whose_kwargs_open_connections_to_the_primary(
    sentinel_setup,
):
    client = sentinel_setup.sentinel_manager().master_for(
        sentinel_setup.service_name, socket_timeout=2
    )
    pool = client.connection_pool
    assert type(pool) is SentinelConnectionPool
    assert pool.connection_class is SentinelManagedConnection
    assert pool.service_name == sentinel_setup.service_name
    assert pool.is_master
    assert pool.get_master_address() == sentinel_setup.primary.address
    kwargs = pool.connection_kwargs
    assert kwargs["socket_timeout"] == 2
    # The proxy the connection asks for the primary's address on every connect.
    assert kwargs["connection_pool"] is pool.proxy

    connection = pool.connection_class(**pool.connection_kwargs)
    try:
        connection.connect()
        assert (connection.host, connection.port) == sentinel_setup.primary.address
        connection.send_command("PING")
        assert connection.read_response() == b"PONG"
    finally:
        connection.disconnect()
    client.close()


def test_sentinel_clients_after_a_failover(private_sentinel):
    setup = private_sentinel
    pooled = setup.client(retry=Retry(NoBackoff(), 3))
    pooled.set("k", "v")
    pool = pooled.connection_pool
    own = pool.connection_class(**pool.connection_kwargs)
    own.connect()
    assert own.port == setup.primary.port

    setup.failover()

    # Reads still work on the demoted primary; the first write fails even with retries,
    # since redis-py 8.1 reconnects a retried command to the same address.
    assert pooled.get("k") == b"v"
    with pytest.raises(redis.ConnectionError, match="previous master is now a slave"):
        pooled.set("k", "w")
    pooled.set("k", "w")  # a fresh connect() asks the Sentinels
    with setup.primary.client() as primary:
        assert primary.get("k") == b"w"
    own.disconnect()
    own.connect()
    assert own.port == setup.primary.port
    own.disconnect()
    pooled.close()


async def test_async_sentinel_master_for(sentinel_setup):
    sentinel = redis.asyncio.sentinel.Sentinel(sentinel_setup.sentinels, socket_timeout=2)
    client = sentinel.master_for(sentinel_setup.service_name)
    try:
        assert type(client.connection_pool) is redis.asyncio.sentinel.SentinelConnectionPool
        assert await client.connection_pool.get_master_address() == sentinel_setup.primary.address
        await client.set("async-sentinel", "v")
        assert await client.get("async-sentinel") == b"v"
        await client.delete("async-sentinel")
    finally:
        await client.aclose()
        for sentinel_client in sentinel.sentinels:
            await sentinel_client.aclose()


def test_django_redis_sentinel_client(sentinel_setup):
    caches_setting = {
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            # host = the Sentinel service name; db in the path.
            "LOCATION": f"redis://{sentinel_setup.service_name}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": sentinel_setup.sentinels,
                "SOCKET_TIMEOUT": 2,
            },
        }
    }
    with override_settings(CACHES=caches_setting):
        cache = caches["sentinel"]
        try:
            cache.set("django-redis", 1)
            assert cache.get("django-redis") == 1
            primary_client = cache.client.get_client(write=True)
            replica_client = cache.client.get_client(write=False)
            assert type(primary_client.connection_pool) is SentinelConnectionPool
            assert primary_client.connection_pool.is_master
            assert not replica_client.connection_pool.is_master
            assert primary_client.connection_pool.connection_kwargs["host"] == "mymaster"
            with sentinel_setup.primary.client() as primary:
                assert primary.get(":1:django-redis") == b"1"
                primary.delete(":1:django-redis")
        finally:
            cache.close()
