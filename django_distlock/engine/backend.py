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

from .exceptions import LockError
from .keys import validate_prefix, validate_seconds

__all__ = ["Backend", "Event", "Observer"]

logger = logging.getLogger("django_distlock")

UNBOUNDED = 2**31


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


# Waiting connections learn their CLIENT ID so that a wait can be ended with CLIENT
# UNBLOCK. Where ACLs forbid it the id stays None and waits end by disconnecting.


def _identify_sync(connection: Any) -> None:
    connection.on_connect()
    connection.send_command("CLIENT", "ID")
    try:
        connection.distlock_client_id = connection.read_response()
    except redis.ResponseError:
        connection.distlock_client_id = None


async def _identify_async(connection: Any) -> None:
    await connection.on_connect()
    await connection.send_command("CLIENT", "ID")
    try:
        connection.distlock_client_id = await connection.read_response()
    except redis.ResponseError:
        connection.distlock_client_id = None


class Backend:
    """The Redis server a set of locks lives on, and their defaults.

    ``client`` serves the sync methods of a lock, ``async_client`` the async ones: either
    a ``redis.asyncio.Redis`` or a callable that makes one (called once per event loop,
    since asyncio connections belong to one loop). Keys are written under ``prefix``
    only. ``timeout`` and ``auto_renew`` are the defaults of locks that do not set them.
    ``observer`` is called with an :class:`Event` for every lock event; it must be quick
    and its errors are logged, never raised into the lock.

    Blocking waits use a connection pool of their own, built from the client's settings,
    so that many waiters never starve the client's pool of connections.

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
        tuning: Any = None,
    ) -> None:
        from .core import Tuning

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
        self._wait_pool: redis.ConnectionPool | None = None
        self._overflow: redis.Redis | None = None
        self._renewal_connection: Any = None
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[redis.asyncio.Redis, redis.asyncio.ConnectionPool, Any],
        ] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"<Backend prefix={self.prefix!r} client={self._client!r}>"

    @property
    def client(self) -> redis.Redis:
        """The sync client (``LockError`` if this backend has none)."""
        if self._client is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return self._client

    def wait_pool(self) -> redis.ConnectionPool:
        """The pool of connections that sit in blocking waits (sync)."""
        pool = self._wait_pool
        if pool is None:
            with self._lock:
                if self._wait_pool is None:
                    self._wait_pool = _derived_pool(
                        redis.ConnectionPool, self.client.connection_pool, _identify_sync
                    )
                pool = self._wait_pool
        return pool

    def renewal_connection(self) -> Any:
        """The connection the watchdog thread renews locks on. It is not taken from a
        pool, whose ``get_connection`` would connect with the client's (long) timeouts:
        the caller opens it within the time left on the lease."""
        connection = self._renewal_connection
        if connection is None:
            pool = self.wait_pool()
            connection = pool.connection_class(**pool.connection_kwargs)
            self._renewal_connection = connection
        return connection

    def overflow_client(self) -> redis.Redis:
        """A sync client on the backend's own, unbounded pool, for when the client's
        pool is exhausted."""
        client = self._overflow
        if client is None:
            client = self._overflow = redis.Redis(connection_pool=self.wait_pool())
        return client

    def async_overflow_client(self) -> redis.asyncio.Redis:
        """The async twin of :meth:`overflow_client`, for the running loop."""
        return redis.asyncio.Redis(connection_pool=self.async_wait_pool())

    def async_client(self) -> redis.asyncio.Redis:
        """The async client for the running event loop."""
        return self._async_pair()[0]

    def async_wait_pool(self) -> redis.asyncio.ConnectionPool:
        """The pool of connections that sit in blocking waits, for the running loop."""
        return self._async_pair()[1]

    def _async_pair(self) -> tuple[redis.asyncio.Redis, redis.asyncio.ConnectionPool]:
        loop = asyncio.get_running_loop()
        pair = self._async_clients.get(loop)
        if pair is None:
            source = self._async_source
            if source is None:
                raise LockError("this backend has no async client: pass Backend(async_client=...)")
            client = source if isinstance(source, redis.asyncio.Redis) else source()
            pool = _derived_pool(
                redis.asyncio.ConnectionPool, client.connection_pool, _identify_async
            )
            closer = _close_at_loop_shutdown(
                client,
                pool,
                owned=client is not source,
                forget=functools.partial(self._async_clients.pop, loop, None),
            )
            pair = (client, pool, closer)
            self._async_clients[loop] = pair
        return pair[0], pair[1]

    def close(self) -> None:
        """Close the connections this backend opened for sync locks (its wait pool and
        renewal connection). The client passed in is the caller's to close."""
        pool, self._wait_pool = self._wait_pool, None
        if pool is not None:
            pool.disconnect()
        connection, self._renewal_connection = self._renewal_connection, None
        if connection is not None:
            connection.disconnect()
        self._overflow = None

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
    pool: redis.asyncio.ConnectionPool,
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
            await pool.disconnect()
            if owned:
                await client.aclose()

    generator = closer()
    # Run it to its first `yield` without awaiting (it awaits nothing before), which
    # registers it with the running loop's async-generator hooks.
    with contextlib.suppress(StopIteration):
        generator.asend(None).send(None)
    return generator


def _derived_pool(pool_class: Any, pool: Any, identify: Callable[[Any], Any]) -> Any:
    # Same server and credentials as the client's pool, but unbounded (waiters hold a
    # connection each) and each connection learns its CLIENT ID, to be unblocked by it.
    # redis-py 8 caps pools at 100 connections by default, hence the explicit bound; the
    # maintenance-notification handler belongs to the source pool, and the new pool makes
    # its own.
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    kwargs["redis_connect_func"] = identify
    return pool_class(connection_class=pool.connection_class, max_connections=UNBOUNDED, **kwargs)
