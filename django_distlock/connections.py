"""The lock backend of the current settings: Redis clients taken from django-redis.

Sync locks use the django-redis cache's own client (``get_redis_connection``), so they
share its connection pool. Async locks use a ``redis.asyncio`` client built from the
same cache settings, one per event loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .engine import Backend
from .settings import Config, get_config

__all__ = ["get_backend", "redis_options", "reset_backend"]

_CLIENT_OPTIONS = {
    "USERNAME": "username",
    "PASSWORD": "password",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
}


def redis_options(config: Config) -> tuple[str, dict[str, Any]]:
    """The Redis URL and client options the settings point at."""
    if config.url:
        return config.url, {}
    cache = settings.CACHES.get(config.cache)
    if cache is None:
        raise ImproperlyConfigured(
            f"DISTLOCK['CACHE'] is {config.cache!r}, but CACHES has no such alias"
        )
    if not str(cache.get("BACKEND", "")).startswith("django_redis."):
        raise ImproperlyConfigured(
            f"CACHES[{config.cache!r}] is not a django-redis cache; set DISTLOCK['CACHE'] "
            "to a django-redis alias or DISTLOCK['URL'] to a redis:// URL"
        )
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
    from django_redis import get_redis_connection

    return get_redis_connection(config.cache)


def _async_client_factory(config: Config) -> Callable[[], redis.asyncio.Redis]:
    url, kwargs = redis_options(config)
    return functools.partial(redis.asyncio.Redis.from_url, url, **kwargs)


@functools.cache
def get_backend() -> Backend:
    """The :class:`~django_distlock.engine.Backend` for the current settings (cached
    until ``DISTLOCK`` or ``CACHES`` change)."""
    from .events import observer_for

    config = get_config()
    return Backend(
        _sync_client(config),
        async_client=_async_client_factory(config),
        prefix=config.key_prefix,
        timeout=config.timeout,
        auto_renew=config.auto_renew,
        observer=observer_for(config),
    )


def reset_backend() -> None:
    """Forget the cached backend (the next lock reads the settings again)."""
    get_backend.cache_clear()
