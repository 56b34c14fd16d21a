"""The lock implementations under test, behind one tiny interface.

Every implementation gets its own client built with redis-py's defaults (what users
get): a ``redis.Redis`` on one server, a ``redis.cluster.RedisCluster`` seeded with every
node on a cluster, a ``redis.asyncio.Redis`` for the async rows; their connections count
the requests they write, so the benchmark can report round trips per operation.
Everything is created inside the process that uses it (after fork/spawn).

Where the locks live is a :class:`Target`: one server (a port) or a local cluster (its
nodes' ports); functions that take ``where`` accept either a ``Target`` or a bare port.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.cluster
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
        _count_request()
        super().send_packed_command(command, check_health)


class AsyncCountingConnection(redis.asyncio.connection.Connection):
    """The async twin of :class:`CountingConnection` (same counter)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _count_request()
        await super().send_packed_command(command, check_health)


def _count_request() -> None:
    with CountingConnection._lock:
        CountingConnection.sent += 1


def requests_sent() -> int:
    """Requests sent by every counting connection of this process so far."""
    return CountingConnection.sent


@dataclass(frozen=True)
class Target:
    """Where the locks live: ``kind`` ``"single"`` (one server, ``ports[0]``) or
    ``"cluster"`` (a Redis/Valkey Cluster, every node's port). Picklable, so worker
    processes get it as an argument."""

    kind: str
    ports: tuple[int, ...]

    @classmethod
    def single(cls, port: int) -> Target:
        return cls("single", (port,))

    @classmethod
    def cluster(cls, ports: list[int] | tuple[int, ...]) -> Target:
        return cls("cluster", tuple(ports))

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def is_cluster(self) -> bool:
        return self.kind == "cluster"

    @property
    def urls(self) -> list[str]:
        """Seed URLs, as ``Backend(cluster=...)`` and ``DISTLOCK["CLUSTER"]`` take them."""
        return [f"redis://{HOST}:{port}" for port in self.ports]


def target_of(where: Target | int) -> Target:
    return where if isinstance(where, Target) else Target.single(where)


def _cluster_client(target: Target) -> redis.cluster.RedisCluster:
    nodes = [redis.cluster.ClusterNode(HOST, port) for port in target.ports]
    return redis.cluster.RedisCluster(startup_nodes=nodes)


def _count_cluster_requests(client: redis.cluster.RedisCluster) -> None:
    """Make the node pools of ``client`` open counting connections (``RedisCluster``
    takes no connection class; the one connection its start-up opened is closed)."""
    for node in client.get_nodes():
        pool = node.redis_connection.connection_pool
        pool.disconnect()
        pool.reset()
        pool.connection_class = CountingConnection


@contextlib.contextmanager
def _counting_by_default() -> Iterator[None]:
    """``redis.connection.Connection`` is the counting class meanwhile: the engine's
    ``Backend(cluster=[urls])`` takes its connection class from there when built, and
    has no other way to be given one."""
    saved = redis.connection.Connection
    redis.connection.Connection = CountingConnection  # type: ignore[misc]
    try:
        yield
    finally:
        redis.connection.Connection = saved  # type: ignore[misc]


def make_client(where: Target | int) -> Any:
    """A client with redis-py's default settings whose connections count requests:
    a ``redis.Redis``, or on a cluster a ``redis.cluster.RedisCluster``."""
    target = target_of(where)
    if target.is_cluster:
        client = _cluster_client(target)
        _count_cluster_requests(client)
        return client
    client = redis.Redis(host=HOST, port=target.port)
    client.connection_pool.connection_class = CountingConnection
    return client


def plain_client(where: Target | int) -> Any:
    """A client whose requests are not counted (the benchmark's own reads and writes)."""
    target = target_of(where)
    if target.is_cluster:
        return _cluster_client(target)
    return redis.Redis(host=HOST, port=target.port)


def make_async_client(where: Target | int) -> redis.asyncio.Redis:
    """A ``redis.asyncio.Redis`` with redis-py's defaults whose connections count
    requests (one server only: the async rows run in the uncontended case)."""
    target = target_of(where)
    if target.is_cluster:
        raise ValueError("the async implementations run on a single server only")
    client = redis.asyncio.Redis(host=HOST, port=target.port)
    client.connection_pool.connection_class = AsyncCountingConnection
    return client


class Handle(Protocol):
    def acquire(self) -> bool: ...
    def release(self) -> None: ...


class AsyncHandle(Protocol):
    def acquire(self) -> Awaitable[bool]: ...
    def release(self) -> Awaitable[None]: ...


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


class AsyncFloor:
    """:class:`Floor` with ``redis.asyncio``: the async rows' two-round-trip floor."""

    def __init__(self, client: redis.asyncio.Redis, name: str, lease: float) -> None:
        self.client = client
        self.key = f"afloor:{name}"
        self.lease_ms = int(lease * 1000)
        self.script = client.register_script(_COMPARE_AND_DELETE)
        self.token = b""

    async def acquire(self) -> bool:
        token = os.urandom(16).hex().encode()
        if await self.client.set(self.key, token, nx=True, px=self.lease_ms):
            self.token = token
            return True
        return False

    async def release(self) -> None:
        if not await self.script(keys=[self.key], args=[self.token]):
            raise RuntimeError("async floor: released a lock it did not hold")


# -- factories --------------------------------------------------------------------------


def _distlock(
    client: Any,
    name: str,
    lease: float,
    *,
    fair: bool = False,
    auto_renew: bool = True,
) -> Handle:
    from django_distlock.engine import Backend, Lock

    if isinstance(client, redis.cluster.RedisCluster):
        # Seed URLs, as DISTLOCK["CLUSTER"] gives them; the engine opens its own
        # connections to every node (counted too).
        seeds = [f"redis://{node.host}:{node.port}" for node in client.get_nodes()]
        with _counting_by_default():
            backend = Backend(
                cluster=seeds, prefix="distlock:", timeout=30.0, auto_renew=auto_renew
            )
    else:
        kwargs = client.connection_pool.connection_kwargs
        backend = Backend(
            client,
            async_client=lambda: redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"]),
            prefix="distlock:",
            timeout=30.0,
            auto_renew=auto_renew,
        )
    return Lock(name, backend=backend, timeout=lease, fair=fair)


class _AsyncDistlock:
    """Our lock through ``aacquire()``/``arelease()`` on a backend with only an async
    client."""

    def __init__(
        self, client: redis.asyncio.Redis, name: str, lease: float, *, auto_renew: bool = True
    ) -> None:
        from django_distlock.engine import Backend, Lock

        backend = Backend(
            async_client=client, prefix="distlock:", timeout=30.0, auto_renew=auto_renew
        )
        self.lock = Lock(name, backend=backend, timeout=lease)

    def acquire(self) -> Awaitable[bool]:
        return self.lock.aacquire()

    def release(self) -> Awaitable[None]:
        return self.lock.arelease()


class _RedisPy:
    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        # redis-py's defaults: sleep=0.1 between polls, blocking, no blocking_timeout.
        self.lock = client.lock(f"redis-py:{name}", timeout=lease)

    def acquire(self) -> bool:
        # Keywords only: the first positional parameter of the sync acquire() is `sleep`.
        return bool(self.lock.acquire(blocking=True))

    def release(self) -> None:
        self.lock.release()


class _AsyncRedisPy:
    def __init__(self, client: redis.asyncio.Redis, name: str, lease: float) -> None:
        # redis.asyncio's Lock with its defaults (sleep=0.1, blocking, no timeout).
        self.lock = client.lock(f"aredis-py:{name}", timeout=lease)

    async def acquire(self) -> bool:
        return bool(await self.lock.acquire(blocking=True))

    async def release(self) -> None:
        await self.lock.release()


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
    make: Callable[[Any, str, float], Any]
    contended: bool = True
    """Part of the contended and crashed-holder scenarios (the floor cannot wait)."""
    is_async: bool = False
    """Made from a ``redis.asyncio.Redis``; ``acquire``/``release`` return awaitables."""
    floor: str = "floor"
    """The floor this row's ratios are taken against (same API: sync or async)."""
    peer: str = "redis-py"
    """redis-py's ``Lock`` of the same API, for the ``x redis-py Lock`` ratios."""


def _distlock_default(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease)


def _distlock_fair(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease, fair=True)


def _distlock_no_renew(client: redis.Redis, name: str, lease: float) -> Handle:
    return _distlock(client, name, lease, auto_renew=False)


def _async_distlock_no_renew(client: redis.asyncio.Redis, name: str, lease: float) -> Any:
    return _AsyncDistlock(client, name, lease, auto_renew=False)


_ASYNC = {"is_async": True, "floor": "afloor", "peer": "aredis-py"}


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
        Impl("afloor", "async floor: SET NX PX + Lua CAD", AsyncFloor, False, **_ASYNC),
        Impl("adistlock", "async distlock (aacquire/arelease)", _AsyncDistlock, False, **_ASYNC),
        Impl(
            "adistlock-norenew",
            "async distlock auto_renew=False",
            _async_distlock_no_renew,
            False,
            **_ASYNC,
        ),
        Impl("aredis-py", "async redis-py Lock (redis.asyncio)", _AsyncRedisPy, False, **_ASYNC),
    )
}


def make(
    key: str,
    where: Target | int,
    name: str,
    lease: float = LEASE,
    *,
    renew: bool = True,
    client: Any = None,
) -> Any:
    """A lock handle of implementation ``key``, on a fresh client unless one is given
    (an async one for the async rows: make those inside the event loop using them).

    ``renew=False`` turns our watchdog off (the peers do not renew by default)."""
    if IMPLS[key].is_async:
        if client is None:
            client = make_async_client(where)
        if key == "adistlock" and not renew:
            return _AsyncDistlock(client, name, lease, auto_renew=False)
        return IMPLS[key].make(client, name, lease)
    if client is None:
        client = make_client(where)
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


_WHY_NOT = {
    "python-redis-lock": (
        "refuses a RedisCluster client (ValueError: not a StrictRedis); with strict=False "
        "its release script fails: its lock and signal keys hash to different slots"
    ),
}


def unusable_reason(key: str, where: Target | int) -> str | None:
    """Why implementation ``key`` cannot run on ``where`` (one acquire+release of a free
    lock, called the way its documentation shows, fails), or ``None`` if it can."""
    try:
        handle = make(key, where, f"probe:{key}", 5.0, renew=False)
        if not handle.acquire():
            return "acquire() of a free lock returned False"
        handle.release()
    except Exception as exc:
        found = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return _WHY_NOT.get(key, found)
    return None
