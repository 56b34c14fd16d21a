"""What the Sentinel clients we build on (``django_distlock/connections.py``: redis-py's
``master_for``, sync and async, and django-redis's ``SentinelClient``) do on a real
Sentinel topology (redis-py 8, django-redis 7), pinned so that an upgrade that changes it
fails here first. The findings are written up in ``tests/support/TOPOLOGIES.md``; what
the Cluster clients do is pinned in ``tests/engine/transport/test_routes_clients.py``."""

import pytest
import redis
import redis.asyncio.sentinel
from django.core.cache import caches
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection


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
