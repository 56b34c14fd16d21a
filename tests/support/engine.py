"""Helpers shared by the engine tests (fixtures live in ``conftest.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from django_distlock.engine import Backend, Event, Lock, LockKeys
from tests.support import REPO_ROOT

HOST = "127.0.0.1"
PREFIX = "distlock:"


def sync_client(port: int, **kwargs: Any) -> redis.Redis:
    """A client that fails at once instead of retrying (fault tests must be quick)."""
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    return redis.Redis(host=HOST, port=port, **kwargs)


def async_client(port: int, **kwargs: Any) -> redis.asyncio.Redis:
    """Async twin of :func:`sync_client`."""
    kwargs.setdefault("retry", redis.asyncio.retry.Retry(NoBackoff(), 0))
    return redis.asyncio.Redis(host=HOST, port=port, **kwargs)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
    return port


def lock_key(name: str, prefix: str = PREFIX) -> str:
    return LockKeys.for_name(prefix, name).lock


def keys_of(name: str, prefix: str = PREFIX) -> LockKeys:
    return LockKeys.for_name(prefix, name)


def primaries_of(client: redis.Redis | RedisCluster) -> list[redis.Redis]:
    """A client per primary: the client itself, or one per primary of a cluster."""
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def keys_matching(client: redis.Redis | RedisCluster, pattern: str = "*") -> list[bytes]:
    """``KEYS pattern`` on every primary, sorted (a cluster client asks one node only)."""
    return sorted(key for primary in primaries_of(client) for key in primary.keys(pattern))


def script_calls(client: redis.Redis | RedisCluster) -> int:
    """Scripts run so far (``EVALSHA`` + ``EVAL``, from ``INFO commandstats``), on every
    primary."""
    return sum(
        stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)
        for stats in (primary.info("commandstats") for primary in primaries_of(client))
        for cmd in ("evalsha", "eval")
    )


def server_time_us(client: redis.Redis | RedisCluster) -> int:
    seconds, micros = primaries_of(client)[0].time()
    return seconds * 1_000_000 + micros


def blocked_clients(client: redis.Redis | RedisCluster) -> int:
    """Clients blocked in a ``BLPOP`` right now (on every primary)."""
    return sum(int(primary.info("clients")["blocked_clients"]) for primary in primaries_of(client))


def lock_waiters(client: redis.Redis) -> int:
    """Clients blocked waiting for a lock now (``BLPOP``, flag ``b``; Celery workers wait
    for messages with ``BRPOP``). An idle wait connection back in its pool still shows
    ``BLPOP`` as its last command, without the flag."""
    return sum(
        1 for entry in client.client_list() if entry["cmd"] == "blpop" and "b" in entry["flags"]
    )


def wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll ``predicate`` (for state only the server can tell) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.002)


@contextlib.contextmanager
def held_until_a_waiter_blocks(
    lock: Lock, client: redis.Redis, then: Callable[[], object] = lambda: None
) -> Iterator[None]:
    """Hold ``lock`` in a thread until a client blocks waiting for it (``BLPOP``), call
    ``then`` while still holding, and release. The block runs once the lock is held; on
    leaving, the thread is joined and whatever it raised fails the test."""
    holding = threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with lock:
                holding.set()
                wait_until(lambda: blocked_clients(client) == 1)
                then()
        except BaseException as exc:
            failures.append(exc)
            holding.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        yield
    finally:
        holder.join(10)
    assert failures == []


async def await_until(predicate: Callable[[], object], within: float = 10.0) -> None:
    """Async twin of :func:`wait_until` (lets the event loop run meanwhile)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.002)


@dataclass(frozen=True)
class StoredLock:
    """The value of a lock key: four newline-separated fields, then the owner JSON."""

    token: str
    fence: int
    acquired_at_us: int
    lease_ms: int
    owner: dict[str, Any]

    @property
    def lease_end_ms(self) -> int:
        """When the lease ends, in epoch ms on the server clock: the lock's score in the
        listing index (both come from one ``TIME`` in the acquire script)."""
        return self.acquired_at_us // 1000 + self.lease_ms


def stored_lock(client: redis.Redis, name: str, prefix: str = PREFIX) -> StoredLock | None:
    raw = client.get(lock_key(name, prefix))
    if raw is None:
        return None
    token, fence, acquired_at_us, lease_ms, owner = raw.decode().split("\n", 4)
    return StoredLock(token, int(fence), int(acquired_at_us), int(lease_ms), json.loads(owner))


async def close_backend(backend: Backend) -> None:
    """Close every connection a backend opened (unclosed ones fail the run as warnings)."""
    with contextlib.suppress(Exception):
        if backend._client is not None:
            backend._client.close()
    backend.close()
    await backend.aclose()


class Recorder:
    """An observer that keeps every event and lets tests wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._condition = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._condition:
            self.events.append(event)
            self._condition.notify_all()

    def kinds(self) -> list[str]:
        with self._condition:
            return [event.kind for event in self.events]

    def of(self, kind: str) -> list[Event]:
        with self._condition:
            return [event for event in self.events if event.kind == kind]

    def wait_for(self, kind: str, timeout: float) -> Event | None:
        """Block until an event of ``kind`` arrives (for sync tests)."""
        with self._condition:
            self._condition.wait_for(lambda: any(e.kind == kind for e in self.events), timeout)
        found = self.of(kind)
        return found[0] if found else None

    async def await_for(self, kind: str, within: float) -> Event | None:
        """Wait, letting the event loop run, until an event of ``kind`` arrives (events
        come from threads and from the loop alike, so this polls)."""
        deadline = time.monotonic() + within
        while not self.of(kind) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        found = self.of(kind)
        return found[0] if found else None


class Api:
    """One face of the lock (sync or async) behind async methods, so a scenario can be
    written once and run against both. The sync face calls the sync methods directly
    in the test's thread and task."""

    name = ""

    async def acquire(self, lock: Lock, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError

    async def release(self, lock: Lock) -> None:
        raise NotImplementedError

    async def extend(self, lock: Lock, *args: Any, **kwargs: Any) -> float:
        raise NotImplementedError

    async def reacquire(self, lock: Lock) -> float:
        raise NotImplementedError

    async def ttl(self, lock: Lock) -> float | None:
        raise NotImplementedError

    async def owned(self, lock: Lock) -> bool:
        raise NotImplementedError

    async def locked(self, lock: Lock) -> bool:
        raise NotImplementedError

    def hold(self, lock: Lock) -> contextlib.AbstractAsyncContextManager[Lock]:
        raise NotImplementedError


class SyncApi(Api):
    name = "sync"

    async def acquire(self, lock: Lock, *args: Any, **kwargs: Any) -> bool:
        return lock.acquire(*args, **kwargs)

    async def release(self, lock: Lock) -> None:
        lock.release()

    async def extend(self, lock: Lock, *args: Any, **kwargs: Any) -> float:
        return lock.extend(*args, **kwargs)

    async def reacquire(self, lock: Lock) -> float:
        return lock.reacquire()

    async def ttl(self, lock: Lock) -> float | None:
        return lock.ttl()

    async def owned(self, lock: Lock) -> bool:
        return lock.owned()

    async def locked(self, lock: Lock) -> bool:
        return lock.locked()

    @contextlib.asynccontextmanager
    async def hold(self, lock: Lock) -> AsyncIterator[Lock]:
        with lock:
            yield lock


class AsyncApi(Api):
    name = "async"

    async def acquire(self, lock: Lock, *args: Any, **kwargs: Any) -> bool:
        return await lock.aacquire(*args, **kwargs)

    async def release(self, lock: Lock) -> None:
        await lock.arelease()

    async def extend(self, lock: Lock, *args: Any, **kwargs: Any) -> float:
        return await lock.aextend(*args, **kwargs)

    async def reacquire(self, lock: Lock) -> float:
        return await lock.areacquire()

    async def ttl(self, lock: Lock) -> float | None:
        return await lock.attl()

    async def owned(self, lock: Lock) -> bool:
        return await lock.aowned()

    async def locked(self, lock: Lock) -> bool:
        return await lock.alocked()

    @contextlib.asynccontextmanager
    async def hold(self, lock: Lock) -> AsyncIterator[Lock]:
        async with lock:
            yield lock


def thread_future(func: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``func`` in a new thread of its own; its outcome resolves the returned future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if future.done():
            return
        if failed:
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def target() -> None:
        try:
            result = func()
        except BaseException as exc:  # handed to the awaiting test
            loop.call_soon_threadsafe(settle, exc, True)
        else:
            loop.call_soon_threadsafe(settle, result, False)

    threading.Thread(target=target, daemon=True).start()
    return future


def in_other_thread(func: Callable[..., Any], *args: Any) -> Any:
    """Run ``func`` in a fresh thread and return its result (or raise its exception)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(func, *args).result(timeout=30)


def python(code: str) -> list[str]:
    """The command line that runs ``code`` (dedented) in this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def deadline_of(lock: Lock) -> float:
    """The holder's own lease end, on the monotonic clock."""
    return time.monotonic() + (lock.valid_until - time.time())


def start_worker(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m tests.support.workers ARGS`` from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.workers", *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_worker(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Kill ``process`` if it still runs and return its remaining output."""
    if process.poll() is None:
        process.kill()
    out, err = process.communicate(timeout=30)
    return out, err


def awaiting(task: asyncio.Task[Any]) -> str:
    """Where ``task`` is suspended, innermost last: each coroutine's function and line,
    down its chain of awaits to the future it waits on (``Task.get_stack`` shows only
    the outermost frame of a suspended task)."""
    lines = []
    step: Any = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
        if frame is None:
            lines.append(f"  awaiting {step!r}")
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
    return "\n".join(lines)
