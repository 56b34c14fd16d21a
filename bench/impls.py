"""The lock implementations under test, behind one tiny interface.

Every implementation gets its own ``redis.Redis`` client built with redis-py's defaults
(what users get), except that its connections count the requests they write, so the
benchmark can report round trips per operation. Everything is created inside the
process that uses it (after fork/spawn).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio
import redis.connection

HOST = "127.0.0.1"
LEASE = 10.0  # seconds, the same for every implementation


class CountingConnection(redis.connection.Connection):
    """A redis-py connection that counts the requests it sends.

    One ``send_packed_command`` is one request on the wire (a pipeline is one too), and
    a sync client waits for its answer before sending the next one, so the count is the
    number of round trips (a ``BLPOP`` parked on a wait connection counts as one).
    """

    sent = 0
    _lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection._lock:
            CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def requests_sent() -> int:
    """Requests sent by every counting connection of this process so far."""
    return CountingConnection.sent


def make_client(port: int) -> redis.Redis:
    """A client with redis-py's default settings whose connections count requests."""
    client = redis.Redis(host=HOST, port=port)
    client.connection_pool.connection_class = CountingConnection
    return client


class Handle(Protocol):
    def acquire(self) -> bool: ...
    def release(self) -> None: ...


# -- the two-round-trip floor ---------------------------------------------------------

_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Floor:
    """``SET key token NX PX`` then a Lua compare-and-delete: the least a safe lock can do.

    No waiting: it only exists for the uncontended case."""

    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        self.client = client
        self.key = f"floor:{name}"
        self.lease_ms = int(lease * 1000)
        self.script = client.register_script(_COMPARE_AND_DELETE)
        self.token = b""

    def acquire(self) -> bool:
        token = os.urandom(16).hex().encode()
        if self.client.set(self.key, token, nx=True, px=self.lease_ms):
            self.token = token
            return True
        return False

    def release(self) -> None:
        if not self.script(keys=[self.key], args=[self.token]):
            raise RuntimeError("floor: released a lock it did not hold")


# -- factories --------------------------------------------------------------------------


def _distlock(
    client: redis.Redis,
    name: str,
    lease: float,
    *,
    fair: bool = False,
    auto_renew: bool = True,
) -> Handle:
    from django_distlock.engine import Backend, Lock

    kwargs = client.connection_pool.connection_kwargs
    backend = Backend(
        client,
        async_client=lambda: redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"]),
        prefix="distlock:",
        timeout=30.0,
        auto_renew=auto_renew,
    )
    return Lock(name, backend=backend, timeout=lease, fair=fair)


class _RedisPy:
    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        # redis-py's defaults: sleep=0.1 between polls, blocking, no blocking_timeout.
        self.lock = client.lock(f"redis-py:{name}", timeout=lease)

    def acquire(self) -> bool:
        # Keywords only: the first positional parameter of the sync acquire() is `sleep`.
        return bool(self.lock.acquire(blocking=True))

    def release(self) -> None:
        self.lock.release()


class _PythonRedisLock:
    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        import redis_lock

        # expire is whole seconds in python-redis-lock; auto_renewal=False is its default.
        self.lock = redis_lock.Lock(client, name, expire=max(1, round(lease)), auto_renewal=False)

    def acquire(self) -> bool:
        return bool(self.lock.acquire(blocking=True))

    def release(self) -> None:
        self.lock.release()


class _Pottery:
    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        from pottery import Redlock

        self.lock = Redlock(key=name, masters={client}, auto_release_time=lease)

    def acquire(self) -> bool:
        return bool(self.lock.acquire())  # its default: blocking, no timeout

    def release(self) -> None:
        self.lock.release()


@dataclass(frozen=True)
class Impl:
    key: str
    label: str
    make: Callable[[redis.Redis, str, float], Handle]
    contended: bool = True
    """Part of the contended and crashed-holder scenarios (the floor cannot wait)."""


def _distlock_default(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease)


def _distlock_fair(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease, fair=True)


def _distlock_no_renew(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease, auto_renew=False)


IMPLS: dict[str, Impl] = {
    impl.key: impl
    for impl in (
        Impl("floor", "floor: SET NX PX + Lua CAD", Floor, contended=False),
        Impl("distlock", "distlock", _distlock_default),
        Impl("distlock-norenew", "distlock auto_renew=False", _distlock_no_renew, False),
        Impl("distlock-fair", "distlock fair=True", _distlock_fair),
        Impl("redis-py", "redis-py Lock (sleep=0.1)", _RedisPy),
        Impl("python-redis-lock", "python-redis-lock", _PythonRedisLock),
        Impl("pottery", "pottery Redlock", _Pottery),
    )
}


def make(
    key: str,
    port: int,
    name: str,
    lease: float = LEASE,
    *,
    renew: bool = True,
    client: redis.Redis | None = None,
) -> Handle:
    """A lock handle of implementation ``key``, on a fresh client unless one is given.

    ``renew=False`` turns our watchdog off (the peers do not renew by default)."""
    if client is None:
        client = make_client(port)
    if key.startswith("distlock") and not renew:
        return _distlock(client, name, lease, fair=key == "distlock-fair", auto_renew=False)
    return IMPLS[key].make(client, name, lease)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("redis", "hiredis", "python-redis-lock", "pottery", "django-distlock"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "-"
    return found
