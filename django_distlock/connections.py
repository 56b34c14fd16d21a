"""The lock backend of the current settings: Redis clients taken from django-redis.

Sync locks use the django-redis cache's own client (``get_redis_connection``), so they
share its connection pool. Async locks use a ``redis.asyncio`` client built from the
same cache settings, one per event loop. Lock events go to the observer the app
installs at start-up (:func:`observe_with`, from ``AppConfig.ready()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection

from .engine import Backend, Observer
from .settings import Config, get_config

__all__ = [
    "CacheError",
    "get_backend",
    "lock_cache",
    "observe_with",
    "redis_options",
    "reset_backend",
]

_CLIENT_OPTIONS = {
    "USERNAME": "username",
    "PASSWORD": "password",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
}

_observer_for: Callable[[Config], Observer | None] | None = None


class CacheError(ImproperlyConfigured):
    """``DISTLOCK["CACHE"]`` names no usable django-redis cache; ``check_id`` and
    ``hint`` are those of the system check that reports it."""

    def __init__(self, message: str, *, check_id: str, hint: str) -> None:
        super().__init__(message)
        self.check_id = check_id
        self.hint = hint


def lock_cache(config: Config) -> dict[str, Any] | None:
    """The ``CACHES`` entry whose Redis holds the locks (``None`` with ``URL``); raises
    :class:`CacheError` when there is no such django-redis cache."""
    if config.url:
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
    backend = str(cache.get("BACKEND", ""))
    if not backend.startswith("django_redis."):
        raise CacheError(
            f"CACHES[{config.cache!r}] uses {backend!r}, which is not a django-redis "
            "cache, so django-distlock cannot find its Redis",
            check_id="django_distlock.E003",
            hint="Use 'django_redis.cache.RedisCache' as its BACKEND, point "
            "DISTLOCK['CACHE'] at a django-redis alias, or set DISTLOCK['URL'] to a "
            "redis:// URL.",
        )
    return dict(cache)


def redis_options(config: Config) -> tuple[str, dict[str, Any]]:
    """The Redis URL and client options the settings point at."""
    cache = lock_cache(config)
    if cache is None:
        return str(config.url), {}
    location = cache.get("LOCATION")
    if isinstance(location, list | tuple):
        location = location[0]  # django-redis writes to the first server
    if not isinstance(location, str) or not location:
        raise ImproperlyConfigured(f"CACHES[{config.cache!r}]['LOCATION'] must be a Redis URL")
    options = cache.get("OPTIONS", {})
    kwargs = {arg: options[key] for key, arg in _CLIENT_OPTIONS.items() if options.get(key)}
    kwargs.update(options.get("CONNECTION_POOL_KWARGS", {}))
    return location, kwargs


def _sync_client(config: Config) -> redis.Redis:
    if config.url:
        return redis.Redis.from_url(config.url)
    redis_options(config)  # a clear error before django-redis's own
    return get_redis_connection(config.cache)


def _async_client_factory(config: Config) -> Callable[[], redis.asyncio.Redis]:
    url, kwargs = redis_options(config)
    return functools.partial(redis.asyncio.Redis.from_url, url, **kwargs)


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
    return Backend(
        _sync_client(config),
        async_client=_async_client_factory(config),
        prefix=config.key_prefix,
        timeout=config.timeout,
        auto_renew=config.auto_renew,
        observer=None if _observer_for is None else _observer_for(config),
    )


def reset_backend() -> None:
    """Forget the cached backend (the next lock reads the settings again)."""
    get_backend.cache_clear()
