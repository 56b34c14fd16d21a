"""What :func:`lock_servers` reads from the topology settings (``SENTINELS``,
``SENTINEL_SERVICE``, ``SENTINEL_KWARGS``, ``CLUSTER``) and from django-redis and
django-valkey caches. No server is needed here: ``tests/test_connections_live.py`` locks
on real topologies, and ``tests/test_settings_topology.py`` checks the settings' values."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock.connections import (
    CLUSTER,
    SENTINEL,
    SERVER,
    CacheError,
    LockServers,
    lock_servers,
)
from django_distlock.settings import get_config

SENTINELS = [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
SEEDS = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]


def servers_for(distlock: dict, caches: dict | None = None) -> LockServers:
    overrides = (
        {"DISTLOCK": distlock} if caches is None else {"DISTLOCK": distlock, "CACHES": caches}
    )
    with override_settings(**overrides):
        return lock_servers(get_config())


def test_the_cache_setting_may_stay_when_another_key_says_where():
    # CACHE has a default, so it is always "set": URL, SENTINELS and CLUSTER win over it.
    servers = servers_for({"CACHE": "gone", "CLUSTER": SEEDS})
    assert servers.kind == CLUSTER


# -- lock_servers: the DISTLOCK keys -----------------------------------------------------


def test_url():
    servers = servers_for({"URL": "redis://:pw@10.0.0.1:6379/2"})
    assert (servers.kind, servers.origin, servers.url) == (
        SERVER,
        "DISTLOCK['URL']",
        "redis://:pw@10.0.0.1:6379/2",
    )
    assert servers.describe() == "one Redis server, redis://:***@10.0.0.1:6379/2"


def test_valkey_urls_are_read_as_redis_urls():
    assert servers_for({"URL": "valkey://10.0.0.1:6379/0"}).url == "redis://10.0.0.1:6379/0"
    assert servers_for({"CLUSTER": ["valkeys://:pw@10.0.0.1:7000"]}).seeds == (
        "rediss://:pw@10.0.0.1:7000",
    )


def test_sentinels_with_a_service_name():
    servers = servers_for({"SENTINELS": SENTINELS, "SENTINEL_SERVICE": "mymaster"})
    assert servers.kind == SENTINEL
    assert servers.origin == "DISTLOCK['SENTINELS']"
    assert servers.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    assert (servers.service, dict(servers.options), dict(servers.sentinel_options)) == (
        "mymaster",
        {},
        {},
    )
    assert servers.describe() == (
        "the primary of Sentinel service 'mymaster' (Sentinels 10.0.0.1:26379, 10.0.0.2:26379)"
    )


def test_sentinel_service_as_a_url_carries_the_primary_options():
    servers = servers_for(
        {
            "SENTINELS": [["10.0.0.1", 26379]],  # lists, as from JSON, are fine
            "SENTINEL_SERVICE": "rediss://app:secret@locks/3?socket_timeout=2",
            "SENTINEL_KWARGS": {"password": "sentinel-secret"},
        }
    )
    assert servers.sentinels == (("10.0.0.1", 26379),)
    assert servers.service == "locks"
    assert dict(servers.options) == {
        "username": "app",
        "password": "secret",
        "db": 3,
        "socket_timeout": 2.0,
        "ssl": True,
    }
    assert dict(servers.sentinel_options) == {"password": "sentinel-secret"}


def test_sentinels_get_the_primary_socket_timeouts_unless_told_otherwise():
    # As redis-py's Sentinel does when sentinel_kwargs is None: an unanswering Sentinel
    # must not stall an acquire for ever.
    servers = servers_for(
        {
            "SENTINELS": SENTINELS,
            "SENTINEL_SERVICE": "redis://:pw@mymaster/0?socket_timeout=2&socket_connect_timeout=1",
        }
    )
    assert dict(servers.sentinel_options) == {"socket_timeout": 2.0, "socket_connect_timeout": 1.0}


def test_cluster():
    servers = servers_for({"CLUSTER": SEEDS})
    assert (servers.kind, servers.origin, servers.seeds) == (
        CLUSTER,
        "DISTLOCK['CLUSTER']",
        tuple(SEEDS),
    )
    assert servers.describe() == (
        "a Redis Cluster (seed nodes redis://10.0.0.1:7000, redis://10.0.0.2:7000)"
    )


# -- lock_servers: caches ----------------------------------------------------------------

DJANGO_REDIS_SENTINEL = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": "redis://mymaster/1",
    "OPTIONS": {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "SENTINELS": SENTINELS,
        "SENTINEL_KWARGS": {"password": "sentinel-secret"},
        "PASSWORD": "primary-secret",
        "SOCKET_TIMEOUT": 2,
    },
}


def test_django_redis_cache():
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://10.0.0.1:6379/0",
            "OPTIONS": {"PASSWORD": "pw", "CONNECTION_POOL_KWARGS": {"max_connections": 50}},
        }
    }
    servers = servers_for({}, caches)
    assert (servers.kind, servers.origin, servers.url, servers.cache) == (
        SERVER,
        "CACHES['default'] (django-redis)",
        "redis://10.0.0.1:6379/0",
        "default",
    )
    assert dict(servers.options) == {"password": "pw", "max_connections": 50}


def test_django_redis_sentinel_cache():
    servers = servers_for({"CACHE": "locks"}, {"locks": DJANGO_REDIS_SENTINEL})
    assert (servers.kind, servers.origin, servers.service, servers.cache) == (
        SENTINEL,
        "CACHES['locks'] (django-redis)",
        "mymaster",
        "locks",  # sync locks share the cache's own Sentinel-managed client
    )
    assert servers.sentinels == tuple(SENTINELS)
    assert dict(servers.options) == {"password": "primary-secret", "socket_timeout": 2, "db": 1}
    assert dict(servers.sentinel_options) == {"password": "sentinel-secret"}


def test_django_redis_sentinel_cache_without_sentinels():
    cache = {
        **DJANGO_REDIS_SENTINEL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient"},
    }
    with pytest.raises(ImproperlyConfigured, match=r"OPTIONS\['SENTINELS'\] is not set"):
        servers_for({}, {"default": cache})


def test_django_valkey_caches():
    caches = {
        "default": {
            "BACKEND": "django_valkey.cache.ValkeyCache",
            "LOCATION": "valkey://10.0.0.1:6379/0,valkey://10.0.0.2:6379/0",
            "OPTIONS": {"PASSWORD": "pw"},
        },
        "sentinel": {
            "BACKEND": "django_valkey.cache.ValkeyCache",
            "LOCATION": "valkey://mymaster/2",
            "OPTIONS": {
                "CLIENT_CLASS": "django_valkey.client.SentinelClient",
                "SENTINELS": SENTINELS,
            },
        },
        "cluster": {
            "BACKEND": "django_valkey.cluster_cache.cache.ClusterValkeyCache",
            "LOCATION": ["valkey://10.0.0.1:7000", "valkey://10.0.0.2:7000"],
        },
        "async": {
            "BACKEND": "django_valkey.async_cache.cache.AsyncValkeyCache",
            "LOCATION": "valkey://10.0.0.1:6379/4",
        },
    }
    standalone = servers_for({}, caches)
    assert (standalone.kind, standalone.url, standalone.cache) == (
        SERVER,
        "redis://10.0.0.1:6379/0",  # the first server, where django-valkey writes
        None,  # its client is valkey-py's: redis-py clients are built from the settings
    )
    assert standalone.origin == "CACHES['default'] (django-valkey)"
    assert dict(standalone.options) == {"password": "pw"}
    sentinel = servers_for({"CACHE": "sentinel"}, caches)
    assert (sentinel.kind, sentinel.service, dict(sentinel.options), sentinel.cache) == (
        SENTINEL,
        "mymaster",
        {"db": 2},
        None,
    )
    cluster = servers_for({"CACHE": "cluster"}, caches)
    assert (cluster.kind, cluster.seeds) == (
        CLUSTER,
        ("redis://10.0.0.1:7000", "redis://10.0.0.2:7000"),
    )
    assert servers_for({"CACHE": "async"}, caches).url == "redis://10.0.0.1:6379/4"


def test_other_caches_are_e003():
    caches = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache"}}
    with pytest.raises(CacheError) as raised:
        servers_for({}, caches)
    assert raised.value.check_id == "django_distlock.E003"
    assert "not a django-redis cache (nor a django-valkey one)" in str(raised.value)
    assert "SENTINELS, or CLUSTER" in raised.value.hint
