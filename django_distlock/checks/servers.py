"""The deploy checks (``check --deploy``): where locks live (I001), and that every lock
server of the topology (the server, the Sentinels' primary, each Cluster primary)
answers (W001), keeps held locks from eviction (W002) and, when it has replicas, is
asked to wait for one (W003)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.sentinel
from django.apps import AppConfig
from django.core.checks import CheckMessage, Info, Warning
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..connections import CLUSTER, SENTINEL, SERVER, LockServers, lock_servers, redacted
from ..engine import AUTO_REPLICAS, SAFE_EVICTION_POLICY, unsafe_eviction_policy
from ..settings import Config, get_config
from .settings import cache_errors

__all__ = [
    "PING_TIMEOUT",
    "check_eviction_policy",
    "check_lock_servers",
    "check_redis_answers",
    "check_replica_acknowledgement",
]

PING_TIMEOUT = 2.0
"""Seconds the deploy checks wait for Redis to connect and to answer."""


def _deploy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Connection options for the deploy checks: short timeouts, no retries."""
    return {
        **options,
        "socket_timeout": PING_TIMEOUT,
        "socket_connect_timeout": PING_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }


def _with_address(url: str, host: str, port: int) -> str:
    """``url`` (credentials, TLS, options) pointed at ``host:port``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


Primary = tuple[str, redis.Redis]
"""A lock server to check: how messages name it, and a client for it."""


def _server_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    url = str(servers.url)
    try:
        client = redis.Redis.from_url(url, **_deploy_options(servers.options))
    except ValueError as exc:
        warning = Warning(
            f"Redis URL {redacted(url)!r} of django-distlock is not usable: {exc}",
            hint="Use a redis://, rediss:// or unix:// URL in DISTLOCK['URL'] or in "
            "the LOCATION of the cache DISTLOCK['CACHE'] names.",
            id="django_distlock.W001",
        )
        return [], [warning]
    return [(f"Redis at {redacted(url)!r}", client)], []


def _sentinel_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    sentinel = redis.sentinel.Sentinel(
        list(servers.sentinels), sentinel_kwargs=_deploy_options(servers.sentinel_options)
    )
    try:
        host, port = sentinel.discover_master(str(servers.service))
    except (redis.RedisError, OSError) as exc:
        addresses = ", ".join(f"{host}:{port}" for host, port in servers.sentinels)
        warning = Warning(
            f"No Sentinel ({addresses}) names a primary for service {servers.service!r} "
            f"within {PING_TIMEOUT:g} s: {type(exc).__name__}: {exc}",
            hint="Check that the Sentinels run, that they monitor the lock server under "
            "that service name (SENTINEL_SERVICE, or the host of the cache's LOCATION), and "
            "SENTINEL_KWARGS (their password). Until one answers, guarded views answer 503 "
            "and locks raise LockBackendUnavailable.",
            id="django_distlock.W001",
        )
        return [], [warning]
    finally:
        for client in sentinel.sentinels:
            client.close()
    client = redis.Redis(host=host, port=port, **_deploy_options(servers.options))
    label = f"Redis at '{host}:{port}' (the primary of Sentinel service {servers.service!r})"
    return [(label, client)], []


def _cluster_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    errors = []
    for seed in servers.seeds:
        try:
            with redis.Redis.from_url(seed, **_deploy_options({})) as client:
                slots = client.execute_command("CLUSTER", "SLOTS")
        except (redis.RedisError, OSError, ValueError) as exc:
            errors.append(f"{redacted(seed)}: {type(exc).__name__}: {exc}")
            continue
        seed_host = urlsplit(seed).hostname or ""
        addresses = dict.fromkeys(
            (_text(entry[2][0]) or seed_host, int(entry[2][1])) for entry in slots
        )
        return [
            (
                f"Redis at '{host}:{port}' (a Redis Cluster primary)",
                redis.Redis.from_url(_with_address(seed, host, port), **_deploy_options({})),
            )
            for host, port in addresses
        ], []
    warning = Warning(
        f"No seed node of the Redis Cluster answers CLUSTER SLOTS within {PING_TIMEOUT:g} s: "
        + "; ".join(errors),
        hint="Check DISTLOCK['CLUSTER'] (or the LOCATION of the cluster cache "
        "DISTLOCK['CACHE'] names): seed node URLs of running cluster nodes.",
        id="django_distlock.W001",
    )
    return [], [warning]


_PRIMARIES = {SERVER: _server_primaries, SENTINEL: _sentinel_primaries, CLUSTER: _cluster_primaries}


def _deploy_primaries(config: Config) -> tuple[list[Primary], list[CheckMessage]]:
    """A client per lock server (short timeouts, no retries): the server, the primary the
    Sentinels name, or every primary of the Cluster; or the W001 warnings saying why
    there is none."""
    try:
        servers = lock_servers(config)
    except ImproperlyConfigured as exc:
        if cache_errors(config):
            return [], []  # check_settings reports it
        warning = Warning(
            f"django-distlock has no usable Redis URL: {exc}",
            hint="Set the LOCATION of the cache DISTLOCK['CACHE'] names to a redis:// "
            "URL, or set DISTLOCK['URL'].",
            id="django_distlock.W001",
        )
        return [], [warning]
    return _PRIMARIES[servers.kind](servers)


def check_lock_servers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """I001 (``check --deploy``): where locks live, and which setting says so. Skipped
    while the setting is invalid."""
    try:
        config = get_config()
        servers = lock_servers(config)
    except ImproperlyConfigured:
        return []  # check_settings or check_redis_answers reports it
    replicas = ""
    if config.min_replicas and config.min_replicas != AUTO_REPLICAS:
        replicas = (
            f"; an acquire counts once {config.min_replicas} replica(s) acknowledged it "
            f"within {config.replica_timeout:g} s (MIN_REPLICAS, REPLICA_TIMEOUT)"
        )
    return [
        Info(
            f"django-distlock keeps its locks on {servers.describe()}, "
            f"as {servers.origin} says{replicas}",
            id="django_distlock.I001",
        )
    ]


def check_redis_answers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W001 (``check --deploy``): every lock server (the server, the Sentinels' primary,
    each Cluster primary) answers ``PING`` within :data:`PING_TIMEOUT` seconds. Skipped
    while the setting itself is invalid."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    primaries, problems = _deploy_primaries(config)
    for label, client in primaries:
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            problems.append(
                Warning(
                    f"{label} does not answer PING within {PING_TIMEOUT:g} s: "
                    f"{type(exc).__name__}: {exc}",
                    hint="Start that Redis server or point DISTLOCK['URL'] (or the cache "
                    "DISTLOCK['CACHE'] names, or SENTINELS, or CLUSTER) at a running one. "
                    "Until it answers, guarded views answer 503 and locks raise "
                    "LockBackendUnavailable.",
                    id="django_distlock.W001",
                )
            )
        finally:
            client.close()
    return problems


def check_eviction_policy(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W002 (``check --deploy``): every lock server's ``maxmemory-policy`` is
    ``noeviction``. Any other policy lets Redis evict a held lock (``volatile-*`` too:
    lock keys have a TTL), and another process then takes it while its holder still runs.
    Says nothing when a policy cannot be read (W001 reports a Redis that does not
    answer)."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    primaries, _ = _deploy_primaries(config)  # check_redis_answers reports problems
    warnings: list[CheckMessage] = []
    for label, client in primaries:
        try:
            policy = unsafe_eviction_policy(client.execute_command)
        finally:
            client.close()
        if policy is None:
            continue
        warnings.append(
            Warning(
                f"{label} evicts keys when it is full (maxmemory-policy {policy}): a held "
                "lock can vanish, and another process take it while its holder still runs",
                hint="Point DISTLOCK['URL'] at a Redis configured with maxmemory-policy "
                f"{SAFE_EVICTION_POLICY} (a server for locks, apart from the cache's), or set "
                f"maxmemory-policy {SAFE_EVICTION_POLICY} on this one if nothing on it relies "
                "on eviction (on its replicas too: a promoted replica keeps its own).",
                id="django_distlock.W002",
            )
        )
    return warnings


def check_replica_acknowledgement(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W003 (``check --deploy``): a lock server with connected replicas while
    ``MIN_REPLICAS`` is 0: no acquire waits for a replica, so a failover can promote one
    that never got a lock the old primary granted. Says nothing for ``"auto"`` or a
    number, nor when ``INFO replication`` cannot be read (W001 reports a Redis that does not
    answer)."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    if config.min_replicas != 0:
        return []
    primaries, _ = _deploy_primaries(config)  # check_redis_answers reports problems
    warnings: list[CheckMessage] = []
    for label, client in primaries:
        try:
            count = int(client.info("replication").get("connected_slaves", 0))
        except (redis.RedisError, OSError, ValueError):
            count = None
        finally:
            client.close()
        if not count:
            continue
        replicas = f"{count} connected replica{'s' if count != 1 else ''}"
        warnings.append(
            Warning(
                f"{label} has {replicas}, but DISTLOCK['MIN_REPLICAS'] is 0: no acquire "
                "waits for a replica, so a failover can promote one that never got a lock "
                "the old primary granted, and a second process take it",
                hint="Remove MIN_REPLICAS (the default 'auto' waits for one replica where "
                "the primary has one) or set it to 1; keep 0 only if your fences or a "
                "second holder's harmlessness make failovers safe (see docs/deploying.md).",
                id="django_distlock.W003",
            )
        )
    return warnings
