"""``get_backend()`` for every shape of settings, locking for real (sync and async) on the
topologies the suite starts: one server, Sentinel, Cluster, through the ``DISTLOCK`` keys,
django-redis caches and django-valkey caches; and a Sentinel failover under a django-redis
``SentinelClient`` cache. The deploy checks (I001, W001-W003) on the same topologies are
in ``tests/checks/test_servers.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import django_redis.pool
import pytest
from django.core.cache import caches
from django.core.checks import Info
from django.test import override_settings
from django_redis import get_redis_connection

from django_distlock import LockBackendUnavailable, distlock
from django_distlock.connections import get_backend
from tests.support.checks import deploy_messages
from tests.support.redis_servers import RedisServer


def keys_under(prefix: str, servers: list[RedisServer]) -> dict[int, int]:
    """How many keys under ``prefix`` each server holds (by port)."""
    counts = {}
    for server in servers:
        with server.client() as client:
            counts[server.port] = sum(1 for _ in client.scan_iter(match=f"{prefix}*"))
    return counts


def forget(prefix: str, servers: list[RedisServer]) -> None:
    for server in servers:
        with server.client() as client:
            for key in client.scan_iter(match=f"{prefix}*"):
                client.delete(key)


def sentinel_cache(package: str, sentinels: list[tuple[str, int]], db: int = 0) -> dict:
    if package == "django-redis":
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://mymaster/{db}",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": sentinels,
                "SOCKET_TIMEOUT": 2,
            },
        }
    return {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": f"valkey://mymaster/{db}",
        "OPTIONS": {"CLIENT_CLASS": "django_valkey.client.SentinelClient", "SENTINELS": sentinels},
    }


@dataclass
class Shape:
    """One way of saying where locks live, and what must come of it."""

    distlock: dict[str, Any]
    caches: dict[str, Any] | None
    primaries: Callable[[], list[RedisServer]]  # where the lock keys must land
    where: str  # I001: where locks live
    origin: str  # I001: which setting says so
    shared_cache: str | None = None  # the django-redis alias whose client sync locks share

    def settings(self, prefix: str) -> override_settings:
        values: dict[str, Any] = {
            "DISTLOCK": {"EVENTS": "off", "KEY_PREFIX": prefix, **self.distlock}
        }
        if self.caches is not None:
            values["CACHES"] = self.caches
        return override_settings(**values)


def _shape(name: str, fixture: Callable[[str], Any]) -> Shape:
    if name in ("url", "django-redis", "valkey"):
        server: RedisServer = fixture("redis_server")
        where = f"one Redis server, {server.url}"
        if name == "url":
            return Shape({"URL": server.url}, None, lambda: [server], where, "DISTLOCK['URL']")
        if name == "django-redis":
            caches = {
                "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}
            }
            origin = "CACHES['default'] (django-redis)"
            return Shape({}, caches, lambda: [server], where, origin, "default")
        url = server.url.replace("redis://", "valkey://")
        caches = {"default": {"BACKEND": "django_valkey.cache.ValkeyCache", "LOCATION": url}}
        origin = "CACHES['default'] (django-valkey)"
        return Shape({}, caches, lambda: [server], where, origin)
    if name.startswith("sentinel") or name.endswith("sentinel"):
        setup = fixture("sentinel_setup")
        addresses = ", ".join(f"{host}:{port}" for host, port in setup.sentinels)
        where = f"the primary of Sentinel service 'mymaster' (Sentinels {addresses})"
        primaries = lambda: [setup.primary]  # noqa: E731
        if name in ("sentinels", "sentinel-service-url"):
            service = "mymaster" if name == "sentinels" else "redis://mymaster/0?socket_timeout=2"
            distlock = {"SENTINELS": setup.sentinels, "SENTINEL_SERVICE": service}
            return Shape(distlock, None, primaries, where, "DISTLOCK['SENTINELS']")
        package = "django-redis" if name == "django-redis-sentinel" else "django-valkey"
        caches = {"default": sentinel_cache(package, setup.sentinels)}
        shared = "default" if package == "django-redis" else None
        return Shape({}, caches, primaries, where, f"CACHES['default'] ({package})", shared)
    cluster = fixture("cluster_setup")
    seeds = cluster.urls[:3]
    where = f"a Redis Cluster (seed nodes {', '.join(seeds)})"
    if name == "cluster":
        return Shape(
            {"CLUSTER": seeds}, None, lambda: cluster.primaries, where, "DISTLOCK['CLUSTER']"
        )
    locations = [url.replace("redis://", "valkey://") for url in seeds]
    caches = {
        "default": {
            "BACKEND": "django_valkey.cluster_cache.cache.ClusterValkeyCache",
            "LOCATION": locations,
        }
    }
    where = f"a Redis Cluster (seed nodes {', '.join(seeds)})"
    return Shape({}, caches, lambda: cluster.primaries, where, "CACHES['default'] (django-valkey)")


SHAPES = [
    "url",
    "django-redis",
    "valkey",
    "sentinels",
    "sentinel-service-url",
    "django-redis-sentinel",
    "valkey-sentinel",
    "cluster",
    "valkey-cluster",
]


@pytest.fixture(params=SHAPES)
def shape(request: pytest.FixtureRequest) -> tuple[str, Shape]:
    return request.param, _shape(request.param, request.getfixturevalue)


async def _async_cycle(names: list[str]) -> list[int]:
    fences = []
    for name in names:
        async with distlock(name) as lock:
            assert not await distlock(name, blocking=False).aacquire()
            fences.append(lock.fence)
    return fences


def test_every_settings_shape_locks_for_real(shape):
    name, where = shape
    prefix = f"shape-{name}:"
    names = [f"job:{number}" for number in range(12)]
    with where.settings(prefix):
        if where.caches is not None and name.startswith("valkey"):
            # The alias is a real django-valkey cache, configured as its users do.
            caches["default"].set("shape-probe", 1)
            assert caches["default"].get("shape-probe") == 1
            caches["default"].delete("shape-probe")
        backend = get_backend()
        if where.shared_cache is not None:
            own = get_redis_connection(where.shared_cache)
            assert backend.client.connection_pool is own.connection_pool
        fences = []
        for lock_name in names:
            with distlock(lock_name) as lock:
                assert not distlock(lock_name, blocking=False).acquire()
                fences.append(lock.fence)
        held_on = keys_under(prefix, where.primaries())
        assert sum(held_on.values()) > 0, held_on
        if len(held_on) > 1:  # a cluster: locks spread over the primaries
            assert sum(1 for count in held_on.values() if count) >= 2, held_on
        again = asyncio.run(_async_cycle(names))
        assert all(later > earlier for earlier, later in zip(fences, again, strict=True))
        asyncio.run(_async_cycle(names[:1]))  # a second event loop works too
        messages = deploy_messages()
    forget(prefix, where.primaries())
    [info] = messages
    assert isinstance(info, Info)
    assert info.id == "django_distlock.I001"
    assert info.msg == f"django-distlock keeps its locks on {where.where}, as {where.origin} says"


# -- a Sentinel failover under a django-redis SentinelClient cache -------------------------


def _acquire_within(seconds: float, name: str) -> tuple[Any, int]:
    """Take ``name`` (sync), retrying while the backend is unavailable; the lock and how
    many attempts failed."""
    deadline = time.monotonic() + seconds
    failures = 0
    while True:
        lock = distlock(name, blocking_timeout=1)
        try:
            assert lock.acquire()
            return lock, failures
        except LockBackendUnavailable:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_sentinel_cache_after_a_failover(private_sentinel, monkeypatch):
    # django-redis keeps its pools in a process-global dict keyed by LOCATION: a pool made
    # for another Sentinel setup under the same URL would be reused.
    monkeypatch.setattr(django_redis.pool.ConnectionFactory, "_pools", {})
    caches_setting = {"default": sentinel_cache("django-redis", private_sentinel.sentinels)}
    # The cache's client following the failover, without replica acknowledgement: under
    # the default "auto" the promoted primary is also waited on until Tuning.replica_grace
    # has passed since the old one last listed its replica
    # (tests/engine/transport/test_replication.py).
    with override_settings(CACHES=caches_setting, DISTLOCK={"EVENTS": "off", "MIN_REPLICAS": 0}):
        with distlock("invoice:42") as lock:
            before = lock.fence

        async def take() -> int:
            async with distlock("invoice:42") as lock:
                return lock.fence

        before_async = asyncio.run(take())
        old = private_sentinel.primary
        private_sentinel.kill_primary_and_wait_for_failover()
        assert private_sentinel.primary is not old
        lock, failures = _acquire_within(5, "invoice:42")
        after = lock.fence
        assert keys_under("distlock:", [private_sentinel.primary])[private_sentinel.primary.port]
        lock.release()
        after_async = asyncio.run(take())
        lock, _ = _acquire_within(5, "invoice:43")  # a name the old primary never saw
        lock.release()
    assert failures <= 1  # a pooled connection to the dead primary may fail once
    assert before < before_async < after < after_async
