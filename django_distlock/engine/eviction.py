"""Whether the lock server may evict lock keys: its ``maxmemory-policy``.

A Redis that evicts keys when it reaches ``maxmemory`` can drop a held lock, and another
process then takes the lock while its holder still runs. ``allkeys-*`` policies evict
any key; ``volatile-*`` policies evict keys with a TTL, which every lock key has. Only
``noeviction`` (Redis's default; a cache usually runs with an LRU policy) keeps locks
until they are released or their lease ends.

>>> unsafe_eviction_policy(client)                     # doctest: +SKIP
'allkeys-lru'
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["SAFE_EVICTION_POLICY", "eviction_policy", "unsafe_eviction_policy"]

SAFE_EVICTION_POLICY = "noeviction"

_ERRORS = (redis.RedisError, OSError)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


def eviction_policy(client: redis.Redis) -> str | None:
    """The server's ``maxmemory-policy``: from ``CONFIG GET``, or from ``INFO memory``
    where ``CONFIG`` is not allowed (ACLs, managed services renaming it). ``None`` when
    neither answers; never raises."""
    try:
        reply = client.config_get("maxmemory-policy")
    except redis.ResponseError:
        reply = {}
    except _ERRORS:
        return None
    policy = _text(next(iter(reply.values()), None)) if isinstance(reply, dict) else None
    if policy is not None:
        return policy
    try:
        info = client.info("memory")
    except _ERRORS:
        return None
    return _text(info.get("maxmemory_policy")) if isinstance(info, dict) else None


def unsafe_eviction_policy(client: redis.Redis) -> str | None:
    """The server's ``maxmemory-policy`` if it lets the server evict lock keys (anything
    but ``noeviction``), else ``None`` (also when it cannot be read). One round trip
    (two where ``CONFIG`` is refused); never raises."""
    policy = eviction_policy(client)
    return None if policy in (None, SAFE_EVICTION_POLICY) else policy
