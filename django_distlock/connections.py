"""The lock backend of the current settings: where locks live, and the clients to reach it.

:func:`lock_servers` reads the settings once into a :class:`LockServers`: one Redis server,
the primary a set of Sentinels names, or a Redis/Valkey Cluster, and which setting said so
(``DISTLOCK["URL"]``, ``["SENTINELS"]``, ``["CLUSTER"]``, or the cache ``DISTLOCK
["CACHE"]`` names). :func:`get_backend` builds the engine's ``Backend`` from it:

- a django-redis cache (``DefaultClient`` or ``SentinelClient``): sync locks use the
  cache's own client (``get_redis_connection``), sharing its pool; async locks a
  ``redis.asyncio`` client built from the same ``LOCATION`` and ``OPTIONS``;
- a django-valkey cache: its clients are valkey-py objects, so redis-py clients are built
  from its ``LOCATION`` and ``OPTIONS`` (``valkey://`` read as ``redis://``);
- the ``DISTLOCK`` keys: redis-py clients built from them.

Lock events go to the observer the app installs at start-up (:func:`observe_with`, from
``AppConfig.ready()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.connection
import redis.sentinel
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection

from .engine import Backend, Observer
from .settings import Config, as_redis_url, get_config

__all__ = [
    "CLUSTER",
    "SENTINEL",
    "SERVER",
    "CacheError",
    "LockServers",
    "get_backend",
    "lock_cache",
    "lock_servers",
    "observe_with",
    "reset_backend",
]

SERVER = "server"
SENTINEL = "sentinel"
CLUSTER = "cluster"

# Cache OPTIONS (django-redis and django-valkey spell them alike) -> redis-py arguments.
_CLIENT_OPTIONS = {
    "USERNAME": "username",
    "PASSWORD": "password",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
}

# django-redis's and django-valkey's own query argument (primary or replica pool), which
# redis-py would take for a connection option.
_CACHE_QUERY_ARGUMENTS = ("is_master",)

_CACHE_PACKAGES = {"django_redis.": "django-redis", "django_valkey.": "django-valkey"}

_observer_for: Callable[[Config], Observer | None] | None = None


class CacheError(ImproperlyConfigured):
    """``DISTLOCK["CACHE"]`` names no usable django-redis or django-valkey cache;
    ``check_id`` and ``hint`` are those of the system check that reports it."""

    def __init__(self, message: str, *, check_id: str, hint: str) -> None:
        super().__init__(message)
        self.check_id = check_id
        self.hint = hint


@dataclass(frozen=True)
class LockServers:
    """Where locks live, as the settings say.

    ``kind`` is :data:`SERVER`, :data:`SENTINEL` or :data:`CLUSTER`; ``origin`` names the
    setting it comes from. ``options`` are redis-py connection arguments for the lock
    server(s) (credentials, db, TLS, timeouts). A server has a ``url``; a Sentinel
    deployment ``sentinels``, ``service`` and ``sentinel_options`` (for the Sentinels'
    own connections); a cluster ``seeds`` (URLs). ``cache`` is the django-redis alias whose
    client sync locks share, if any.
    """

    kind: str
    origin: str
    url: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    sentinel_options: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[str, ...] = ()
    cache: str | None = None

    def describe(self) -> str:
        """Where locks live, in words, without passwords."""
        if self.kind == SENTINEL:
            sentinels = ", ".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"the primary of Sentinel service {self.service!r} (Sentinels {sentinels})"
        if self.kind == CLUSTER:
            return f"a Redis Cluster (seed nodes {', '.join(map(redacted, self.seeds))})"
        return f"one Redis server, {redacted(str(self.url))}"


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def lock_cache(config: Config) -> dict[str, Any] | None:
    """The ``CACHES`` entry whose Redis holds the locks (``None`` when ``URL``,
    ``SENTINELS`` or ``CLUSTER`` say where instead); raises :class:`CacheError` when there
    is no such django-redis or django-valkey cache."""
    if config.url or config.sentinels or config.cluster:
        return None
    cache = settings.CACHES.get(config.cache)
    if cache is None:
        aliases = ", ".join(map(repr, settings.CACHES)) or "none"
        raise CacheError(
            f"DISTLOCK['CACHE'] is {config.cache!r}, but CACHES has no such alias "
            f"(aliases: {aliases})",
            check_id="django_distlock.E002",
            hint="Add a django-redis cache under that alias to CACHES, set "
            "DISTLOCK['CACHE'] to an existing django-redis alias, or set "
            "DISTLOCK['URL'] to a redis:// URL.",
        )
    if _cache_package(cache) is None:
        backend = str(cache.get("BACKEND", ""))
        raise CacheError(
            f"CACHES[{config.cache!r}] uses {backend!r}, which is not a django-redis cache "
            "(nor a django-valkey one), so django-distlock cannot find its Redis",
            check_id="django_distlock.E003",
            hint="Use 'django_redis.cache.RedisCache' as its BACKEND, point "
            "DISTLOCK['CACHE'] at a django-redis or django-valkey alias, or set "
            "DISTLOCK['URL'] to a redis:// URL (or SENTINELS, or CLUSTER).",
        )
    return dict(cache)


def _cache_package(cache: Mapping[str, Any]) -> str | None:
    backend = str(cache.get("BACKEND", ""))
    for start, package in _CACHE_PACKAGES.items():
        if backend.startswith(start):
            return package
    return None


def lock_servers(config: Config) -> LockServers:
    """Where the settings say locks live (``ImproperlyConfigured`` when they say nothing
    usable, :class:`CacheError` for the cache checks E002/E003)."""
    if config.url:
        return LockServers(SERVER, "DISTLOCK['URL']", url=as_redis_url(config.url))
    if config.sentinels:
        service, options = _service(str(config.sentinel_service))
        return LockServers(
            SENTINEL,
            "DISTLOCK['SENTINELS']",
            options=options,
            sentinels=config.sentinels,
            service=service,
            sentinel_options=_sentinel_options(config.sentinel_kwargs, options),
        )
    if config.cluster:
        return LockServers(
            CLUSTER, "DISTLOCK['CLUSTER']", seeds=tuple(map(as_redis_url, config.cluster))
        )
    cache = lock_cache(config)
    assert cache is not None
    return _cache_servers(config.cache, cache)


def _cache_servers(alias: str, cache: dict[str, Any]) -> LockServers:
    package = _cache_package(cache)
    origin = f"CACHES[{alias!r}] ({package})"
    options = cache.get("OPTIONS") or {}
    locations = _locations(alias, cache.get("LOCATION"))
    client_options = {arg: options[key] for key, arg in _CLIENT_OPTIONS.items() if options.get(key)}
    client_options.update(options.get("CONNECTION_POOL_KWARGS") or {})
    backend = str(cache.get("BACKEND", ""))
    if package == "django-valkey" and ".cluster_cache." in backend:
        return LockServers(CLUSTER, origin, seeds=tuple(locations))
    client_class = str(options.get("CLIENT_CLASS", ""))
    shares_client = package == "django-redis"
    if client_class.endswith("SentinelClient") or options.get("SENTINELS"):
        sentinels = options.get("SENTINELS")
        if not sentinels:
            raise ImproperlyConfigured(
                f"CACHES[{alias!r}] uses a Sentinel client, but its OPTIONS['SENTINELS'] is not set"
            )
        service, url_options = _service(locations[0])
        merged = {**client_options, **url_options}
        return LockServers(
            SENTINEL,
            origin,
            options=merged,
            sentinels=tuple((str(host), int(port)) for host, port in sentinels),
            service=service,
            sentinel_options=_sentinel_options(options.get("SENTINEL_KWARGS"), merged),
            cache=alias if shares_client else None,
        )
    return LockServers(
        SERVER,
        origin,
        url=locations[0],  # django-redis and django-valkey write to the first server
        options=client_options,
        cache=alias if shares_client else None,
    )


def _locations(alias: str, location: Any) -> list[str]:
    if isinstance(location, str):
        location = location.split(",")
    urls = (
        [as_redis_url(str(url).strip()) for url in location]
        if isinstance(location, list | tuple)
        else []
    )
    if not urls or not all(urls):
        raise ImproperlyConfigured(f"CACHES[{alias!r}]['LOCATION'] must be a Redis URL")
    return urls


def _service(value: str) -> tuple[str, dict[str, Any]]:
    """The Sentinel service name and the primary's connection options of a
    ``SENTINEL_SERVICE`` (a name, or a URL whose host is the name) or of a Sentinel cache's
    ``LOCATION`` (``redis://mymaster/0``)."""
    if "://" not in value:
        return value, {}
    parts = urlsplit(as_redis_url(value))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in _CACHE_QUERY_ARGUMENTS]
    options = redis.connection.parse_url(urlunsplit(parts._replace(query=urlencode(query))))
    service = str(options.pop("host"))
    options.pop("port", None)
    # Sentinel pools pick their (Sentinel-managed) connection class themselves.
    if options.pop("connection_class", None) is redis.connection.SSLConnection:
        options["ssl"] = True
    return service, options


def _sentinel_options(
    sentinel_kwargs: Mapping[str, Any] | None, primary_options: Mapping[str, Any]
) -> dict[str, Any]:
    # redis-py's Sentinel does the same when sentinel_kwargs is None: the Sentinels get the
    # primary's socket timeouts, so an unanswering Sentinel cannot stall an acquire.
    if sentinel_kwargs is not None:
        return dict(sentinel_kwargs)
    return {k: v for k, v in primary_options.items() if k.startswith("socket_")}


def _sync_client(servers: LockServers) -> redis.Redis:
    if servers.cache is not None:
        return get_redis_connection(servers.cache)
    if servers.kind == SENTINEL:
        sentinel = redis.sentinel.Sentinel(
            list(servers.sentinels), sentinel_kwargs=dict(servers.sentinel_options)
        )
        return sentinel.master_for(str(servers.service), **servers.options)
    return redis.Redis.from_url(str(servers.url), **servers.options)


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """``redis.asyncio.sentinel.Sentinel`` that asks the Sentinels on connections of the
    running event loop, closed after each question.

    The engine makes an async client for each event loop that takes locks and closes it
    (its pool included) when that loop ends; the Sentinel manager's own connections are
    not the client's, so kept ones would outlive their loop unclosed.
    """

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)
        self._addresses = sentinels
        self._sentinel_kwargs = sentinel_kwargs

    async def discover_master(self, service_name: str) -> Any:
        asking = redis.asyncio.sentinel.Sentinel(
            self._addresses, sentinel_kwargs=self._sentinel_kwargs
        )
        try:
            return await asking.discover_master(service_name)
        finally:
            # Each client, as ``Sentinel.aclose()`` (redis-py 8.1+) does.
            for client in asking.sentinels:
                await client.aclose()


def _async_client_factory(servers: LockServers) -> Callable[[], redis.asyncio.Redis]:
    if servers.kind == SENTINEL:

        def sentinel_primary() -> redis.asyncio.Redis:
            sentinel = _AsyncSentinel(list(servers.sentinels), dict(servers.sentinel_options))
            return sentinel.master_for(str(servers.service), **servers.options)

        return sentinel_primary
    return functools.partial(redis.asyncio.Redis.from_url, str(servers.url), **servers.options)


def observe_with(observer_for: Callable[[Config], Observer | None] | None) -> None:
    """Give every backend built from now on the observer ``observer_for(config)``
    returns (the app installs the events layer's at start-up)."""
    global _observer_for
    _observer_for = observer_for
    reset_backend()


@functools.cache
def get_backend() -> Backend:
    """The :class:`~django_distlock.engine.Backend` for the current settings (cached
    until ``DISTLOCK`` or ``CACHES`` change)."""
    config = get_config()
    servers = lock_servers(config)
    defaults: dict[str, Any] = {
        "prefix": config.key_prefix,
        "timeout": config.timeout,
        "auto_renew": config.auto_renew,
        "min_replicas": config.min_replicas,
        "replica_timeout": config.replica_timeout,
        "observer": None if _observer_for is None else _observer_for(config),
    }
    if servers.kind == CLUSTER:
        return Backend(cluster=list(servers.seeds), **defaults)
    return Backend(_sync_client(servers), async_client=_async_client_factory(servers), **defaults)


def reset_backend() -> None:
    """Forget the cached backend (the next lock reads the settings again)."""
    get_backend.cache_clear()
