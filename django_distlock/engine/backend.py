"""Where locks live: the Redis clients, the key prefix and the defaults of a deployment."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from . import process
from .exceptions import LockError
from .keys import validate_prefix, validate_seconds
from .pools import AsyncConnectionPool, ConnectionPool, connection_settings
from .tuning import Tuning

__all__ = ["Backend", "Event", "Observer"]

logger = logging.getLogger("django_distlock")


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a lock, as told to a backend's observer.

    ``kind`` is one of ``acquired released extended contended lost``; ``waited`` and
    ``held`` are seconds (``None`` where they do not apply); ``at`` is epoch seconds.
    """

    kind: str
    name: str
    fence: int | None
    context: str
    host: str
    pid: int
    thread: str
    waited: float | None = None
    held: float | None = None
    retry_after: float | None = None
    reason: str = ""
    at: float = 0.0


Observer = Callable[[Event], None]

AsyncClientSource = redis.asyncio.Redis | Callable[[], redis.asyncio.Redis]


class Backend:
    """The Redis server a set of locks lives on, and their defaults.

    ``client`` serves the sync methods of a lock, ``async_client`` the async ones: either
    a ``redis.asyncio.Redis`` or a callable that makes one (called once per event loop,
    since asyncio connections belong to one loop). Keys are written under ``prefix``
    only. ``timeout`` and ``auto_renew`` are the defaults of locks that do not set them.
    ``observer`` is called with an :class:`Event` for every lock event; it must be quick
    and its errors are logged, never raised into the lock.

    Blocking waits, renewals and calls that overflow an exhausted client pool use
    connections of the backend's own (:mod:`.pools`), built from the client's settings.
    A process forked from this one starts with none of them.

    >>> import redis
    >>> backend = Backend(redis.Redis(), prefix="myapp:locks:")
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        async_client: AsyncClientSource | None = None,
        prefix: str = "distlock:",
        timeout: float = 30.0,
        auto_renew: bool = True,
        observer: Observer | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        if client is None and async_client is None:
            raise TypeError("Backend needs a client, an async_client, or both")
        if client is not None and not isinstance(client, redis.Redis):
            raise TypeError(f"client must be a redis.Redis, not {type(client).__name__}")
        if not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be a bool, not {type(auto_renew).__name__}")
        if observer is not None and not callable(observer):
            raise TypeError("observer must be callable")
        self.prefix = validate_prefix(prefix)
        self.timeout = validate_seconds(timeout, "timeout")
        self.auto_renew = auto_renew
        self.observer = observer
        self.tuning: Tuning = tuning if tuning is not None else Tuning()
        self._client = client
        self._async_source = async_client
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[redis.asyncio.Redis, AsyncConnectionPool, Any],
        ] = weakref.WeakKeyDictionary()
        _backends.add(self)

    def __repr__(self) -> str:
        return f"<Backend prefix={self.prefix!r} client={self._client!r}>"

    @property
    def client(self) -> redis.Redis:
        """The sync client (``LockError`` if this backend has none)."""
        if self._client is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return self._client

    def pool(self) -> ConnectionPool:
        """The backend's own sync connections (waits, renewals, overflow)."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ConnectionPool(*connection_settings(self.client.connection_pool))
                pool = self._pool
        return pool

    def async_client(self) -> redis.asyncio.Redis:
        """The async client for the running event loop."""
        return self._async_pair()[0]

    def async_pool(self) -> AsyncConnectionPool:
        """The backend's own async connections for the running loop."""
        return self._async_pair()[1]

    def _async_pair(self) -> tuple[redis.asyncio.Redis, AsyncConnectionPool]:
        loop = asyncio.get_running_loop()
        pair = self._async_clients.get(loop)
        if pair is None:
            source = self._async_source
            if source is None:
                raise LockError("this backend has no async client: pass Backend(async_client=...)")
            client = source if isinstance(source, redis.asyncio.Redis) else source()
            pool = AsyncConnectionPool(*connection_settings(client.connection_pool))
            closer = _close_at_loop_shutdown(
                client,
                pool,
                owned=client is not source,
                forget=functools.partial(self._async_clients.pop, loop, None),
            )
            pair = (client, pool, closer)
            self._async_clients[loop] = pair
        return pair[0], pair[1]

    def _forget_after_fork(self) -> None:
        # The parent's connections stay the parent's: they are neither used nor closed
        # here (closing an asyncio connection needs the parent's loop), only forgotten.
        _inherited.append((self._pool, dict(self._async_clients)))
        self._lock = threading.Lock()
        self._pool = None
        self._async_clients = weakref.WeakKeyDictionary()

    def close(self) -> None:
        """Close the idle connections this backend opened for sync locks. The client
        passed in is the caller's to close."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        """Close the connections this backend opened on the running event loop (closed
        anyway when the loop shuts down through ``asyncio.run``)."""
        entry = self._async_clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            closer = entry[2]
            await closer.aclose()

    def emit(self, event: Event) -> None:
        """Tell the observer about ``event``; never raises."""
        observer = self.observer
        if observer is None:
            return
        if not event.at:
            object.__setattr__(event, "at", time.time())
        try:
            observer(event)
        except Exception:
            logger.exception("django-distlock observer failed on %s event", event.kind)


def _close_at_loop_shutdown(
    client: redis.asyncio.Redis,
    pool: AsyncConnectionPool,
    *,
    owned: bool,
    forget: Callable[[], Any],
) -> AsyncGenerator[None, None]:
    """Close ``pool`` (and ``client`` if we made it) when the running loop shuts down.

    Asyncio connections belong to one loop and must be closed on it. An event loop has
    no shutdown callback, but ``shutdown_asyncgens()`` (called by ``asyncio.run`` and by
    test runners) closes every async generator started on it, so we start one whose
    ``finally`` does the clean-up. The returned generator must be kept referenced.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            forget()  # the clients reference the loop: drop them so it can be collected
            await pool.close()
            if owned:
                await client.aclose()

    generator = closer()
    # Run it to its first `yield` without awaiting (it awaits nothing before), which
    # registers it with the running loop's async-generator hooks.
    with contextlib.suppress(StopIteration):
        generator.asend(None).send(None)
    return generator


_backends: weakref.WeakSet[Backend] = weakref.WeakSet()
_inherited: list[Any] = []  # what forked children must keep but never touch


def _forget_connections_after_fork() -> None:
    for backend in list(_backends):
        backend._forget_after_fork()


process.forget_after_fork(_forget_connections_after_fork)
