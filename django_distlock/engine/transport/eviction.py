"""Whether the lock server may evict lock keys: its ``maxmemory-policy``.

A Redis that evicts keys when it reaches ``maxmemory`` can drop a held lock, and another
process then takes the lock while its holder still runs. ``allkeys-*`` policies evict
any key; ``volatile-*`` policies evict keys with a TTL, which every lock key has. Only
``noeviction`` (Redis's default; a cache usually runs with an LRU policy) keeps locks
until they are released or their lease ends.

>>> unsafe_eviction_policy(client.execute_command)     # doctest: +SKIP
'allkeys-lru'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

__all__ = ["SAFE_EVICTION_POLICY", "eviction_policy", "unsafe_eviction_policy"]

SAFE_EVICTION_POLICY = "noeviction"

_ERRORS = (redis.RedisError, OSError)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


def eviction_policy(execute: Callable[..., Any]) -> str | None:
    """The server's ``maxmemory-policy``, asked through ``execute(*command)`` (a client's
    ``execute_command``, or one node's): from ``CONFIG GET``, or from ``INFO memory``
    where ``CONFIG`` is not allowed (ACLs, managed services renaming it). ``None`` when
    neither answers; never raises."""
    try:
        reply = execute("CONFIG", "GET", "maxmemory-policy")
    except redis.ResponseError:
        reply = None
    except _ERRORS:
        return None
    policy = _policy_from_config(reply)
    if policy is not None:
        return policy
    try:
        info = execute("INFO", "memory")
    except _ERRORS:
        return None
    return _policy_from_info(info)


def unsafe_eviction_policy(execute: Callable[..., Any]) -> str | None:
    """The server's ``maxmemory-policy`` if it lets the server evict lock keys (anything
    but ``noeviction``), else ``None`` (also when it cannot be read). One round trip
    (two where ``CONFIG`` is refused); never raises."""
    policy = eviction_policy(execute)
    return None if policy in (None, SAFE_EVICTION_POLICY) else policy


def _policy_from_config(reply: Any) -> str | None:
    # CONFIG GET answers a flat [name, value] list (RESP2) or a map (RESP3, clients).
    if isinstance(reply, dict):
        return _text(next(iter(reply.values()), None))
    if isinstance(reply, list | tuple) and len(reply) >= 2:
        return _text(reply[1])
    return None


def _policy_from_info(info: Any) -> str | None:
    # INFO answers text from a raw connection, a dict from a client.
    if isinstance(info, dict):
        return _text(info.get("maxmemory_policy"))
    text = _text(info)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("maxmemory_policy:"):
            return line.partition(":")[2].strip() or None
    return None
