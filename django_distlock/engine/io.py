"""The two I/O shells: they carry out the steps of :mod:`.core` with sync or async
connections of the backend's own, on the node that serves each key (:mod:`.topology`).
Everything they know about locks is in the steps they are given.

Every Redis or socket failure leaves here as a :class:`LockError`: the server could not
be reached or cannot serve right now (:class:`LockBackendUnavailable`), or it answered
with an error retrying will not cure (:class:`LockBackendError`).

Why this module is long: the two drivers mirror each other method by method, and
reading them side by side is what keeps them mirrored (redis-py's separate sync and
async lock files drifted apart). Only their I/O differs; what to do with a redirect is
decided once, in :func:`.topology.redirect_of`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from .core import AwaitWait, Call, CallEndingWait, Op, Replicated, StartWait
from .exceptions import LockBackendError, LockBackendUnavailable, LockError
from .pools import AsyncConnectionPool
from .topology import Node, redirect_of
from .wire import carried, direct, read_reply, write

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "BACKEND_ERRORS",
    "AsyncDriver",
    "SyncDriver",
    "completed",
    "failure",
    "pack",
    "unavailable",
]

T = TypeVar("T")

BACKEND_ERRORS = (RedisError, OSError)

# Error replies that mean "not now" rather than "never": a replica that is not (yet) the
# primary, a server loading its data or busy with a script, out of memory, a cluster
# without a quorum or in the middle of a migration, too few replicas for
# min-replicas-to-write.
_TRANSIENT_REPLIES = (
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
    OutOfMemoryError,
    AskError,
)
_TRANSIENT_PREFIXES = ("BUSY", "LOADING", "MASTERDOWN", "NOREPLICAS", "READONLY", "TRYAGAIN")

# How long the answer to a BLPOP that we just ended may take at most when the client has
# no socket timeout of its own (it normally arrives within a round trip).
_END_WAIT_REPLY_TIMEOUT = 10.0


def unavailable(name: str | None, exc: BaseException) -> LockBackendUnavailable:
    """The error a caller sees for a Redis call that could not be served."""
    about = "" if name is None else f" for lock {name!r}"
    return LockBackendUnavailable(
        f"Redis unavailable{about}: {type(exc).__name__}: {exc}", name=name
    )


def failure(name: str | None, exc: BaseException) -> LockError:
    """The :class:`LockError` for a failed Redis call: ``LockBackendError`` for an error
    reply that retrying will not cure, ``LockBackendUnavailable`` for everything else."""
    if isinstance(exc, LockError):
        return exc
    if (
        isinstance(exc, ResponseError)
        and not isinstance(exc, _TRANSIENT_REPLIES)
        and not str(exc).startswith(_TRANSIENT_PREFIXES)
    ):
        about = "" if name is None else f" on lock {name!r}"
        return LockBackendError(
            f"Redis refused an operation{about}: {type(exc).__name__}: {exc}", name=name
        )
    return unavailable(name, exc)


# The length prefixes of arguments shorter than this, made once: formatting them was a
# third of the time of packing a lock's request.
_PREFIXES = tuple(b"$%d\r\n" % size for size in range(1024))


def pack(command: Sequence[Any]) -> bytes:
    """``command`` as the bytes of a RESP request. The engine only sends ``str``, ``int``
    and ``bytes``, which this encodes several times faster than redis-py's general
    encoder (a lock cycle sends two commands of about twenty arguments)."""
    return b"*%d\r\n" % len(command) + _pack_items(command)


# Packed ``EVALSHA <sha>`` by script, and packed arguments and key lists: a lock's keys
# and most of its arguments are the same at every call. Plain dictionaries, emptied when
# full, rather than LRU caches: a lookup is the whole cost of packing a cached argument,
# and tokens (new at every acquire, needed once more by its release) pass through.
_HEADS: dict[str, bytes] = {}
# Argument counts of most script calls (listing every bucket takes hundreds of keys).
_COUNTS = tuple(b"*%d\r\n" % count for count in range(64))
_ARGS: dict[str | int | bytes, bytes] = {}
_KEYS: dict[tuple[str, ...], bytes] = {}
_CACHED = 4096


def _packed(arg: str | int | bytes) -> bytes:
    packed = _ARGS.get(arg)
    if packed is None:
        # Values equal to an int (bools, whole floats) would share its entry: the engine
        # sends neither.
        kind = type(arg)
        data = arg.encode() if kind is str else arg if kind is bytes else str(arg).encode()
        packed = b"$%d\r\n%s\r\n" % (len(data), data)
        if len(_ARGS) >= _CACHED:
            _ARGS.clear()
        _ARGS[arg] = packed
    return packed


def pack_call(call: Call) -> bytes:
    """``EVALSHA`` of ``call`` as the bytes of a RESP request (what :func:`pack` makes of
    it, with the script's name, its keys and most arguments packed once and reused)."""
    sha = call.script.sha
    head = _HEADS.get(sha)
    if head is None:
        head = _HEADS[sha] = _pack_items(("EVALSHA", sha))
    keys, args = call.keys, call.args
    packed_keys = _KEYS.get(keys)
    if packed_keys is None:
        packed_keys = b"".join((_packed(len(keys)), *map(_packed, keys)))
        if len(_KEYS) >= _CACHED:
            _KEYS.clear()
        _KEYS[keys] = packed_keys
    # Cached arguments are looked up without a Python call each; the others (usually
    # one: a new token) are packed then.
    packed_args = [*map(_ARGS.get, args)]
    while None in packed_args:
        missing = packed_args.index(None)
        packed_args[missing] = _packed(args[missing])
    count = 3 + len(keys) + len(args)
    header = _COUNTS[count] if count < len(_COUNTS) else b"*%d\r\n" % count
    return b"".join((header, head, packed_keys, *packed_args))


def _pack_items(command: Sequence[Any]) -> bytes:
    out = []
    append = out.append
    prefixes = _PREFIXES
    for arg in command:
        kind = type(arg)
        data = arg.encode() if kind is str else arg if kind is bytes else str(arg).encode()
        size = len(data)
        append(prefixes[size] if size < 1024 else b"$%d\r\n" % size)
        append(data)
        append(b"\r\n")
    return b"".join(out)


def _eval_args(call: Call, *, by_sha: bool) -> tuple[Any, ...]:
    head = ("EVALSHA", call.script.sha) if by_sha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


def _ended_wait_mark(reply: Any) -> bool:
    """True for a BLPOP answer that is an end-of-wait mark, not a wake-up."""
    return isinstance(reply, list | tuple) and reply[1] in (b"c", "c")


def _reply_timeout(connection: Any) -> float:
    return connection.socket_timeout or _END_WAIT_REPLY_TIMEOUT


class _NotConnected(Exception):
    """A connection to a node could not be opened: nothing was sent."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _is_redirect(reply: Any) -> bool:
    return isinstance(reply, AskError | TryAgainError)


def _after_refusal(node: Node, exc: BaseException) -> None:
    """A primary that became a replica (failover) keeps refusing writes on the
    connections opened before: drop them, so the next ones find the new primary."""
    if isinstance(exc, ReadOnlyError) or str(exc).startswith("READONLY"):
        node.drop_idle()


class SyncDriver:
    """Runs steps with the backend's sync connections."""

    __slots__ = (
        "_wait",
        "_wait_asking",
        "_wait_keys",
        "_wait_lost",
        "_wait_node",
        "backend",
        "name",
    )

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: Any = None
        self._wait_node: Node | None = None
        self._wait_keys: tuple[str, ...] = ()
        self._wait_asking = False
        self._wait_lost = False  # a BLPOP was dropped without reading its answer

    # -- single calls -----------------------------------------------------------------

    def call(self, call: Call) -> Any:
        """Run one script (``EVALSHA``, loading it on ``NOSCRIPT``) on the node that
        serves its keys, following cluster redirects."""
        try:
            return self._routed(call.keys[0], call)[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    def execute(self, key: str, *command: Any) -> Any:
        """Run one plain command on the node that serves ``key``."""
        try:
            return self._routed(key, command)[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    def _routed(self, key: str, request: Call | tuple[Any, ...]) -> tuple[Any, Node]:
        topology = self.backend.topology()
        node = topology.node_for(key)
        asking = False
        attempt = 0
        started = time.monotonic()
        while True:
            try:
                return self._on(node, request, asking), node
            except ResponseError as exc:
                redirect = redirect_of(topology, key, exc, attempt, started)
                if redirect is None:
                    _after_refusal(node, exc)
                    raise
                node, asking = redirect.node, redirect.asking
                if redirect.delay:
                    time.sleep(redirect.delay)
                attempt += 1
            except _NotConnected as failed:
                # Nothing was sent: after a failover the slot may be served elsewhere.
                self.backend.node_failed(node)
                node = self._failed_over(key, node, failed)
                attempt += 1
            except (ConnectionError, OSError):
                self.backend.node_failed(node)
                raise

    def _failed_over(self, key: str, node: Node, failed: _NotConnected) -> Node:
        """The node now serving ``key``, read again after ``node`` could not be reached;
        the connection error itself when nothing changed."""
        topology = self.backend.topology()
        moved_to = topology.node_for(key) if topology.is_cluster else node
        if moved_to is node:
            raise failed.error
        return moved_to

    @staticmethod
    def _on(node: Node, request: Call | tuple[Any, ...], asking: bool) -> Any:
        pool = node.pool
        try:
            connection = pool.get()
        except (ConnectionError, OSError) as exc:
            raise _NotConnected(exc) from exc
        try:
            if isinstance(request, Call):
                reply = _script_on(connection, request, asking)
            else:
                if asking:
                    connection.send_packed_command(connection.pack_commands([("ASKING",), request]))
                    connection.read_response()
                else:
                    connection.send_command(*request)
                reply = connection.read_response()
        except ResponseError:
            pool.put(connection)  # a whole reply was read: the connection is fine
            raise
        except BaseException:
            pool.discard(connection)
            raise
        pool.put(connection)
        return reply

    # -- pipelines ----------------------------------------------------------------------

    def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Run ``calls`` pipelined, one round trip per node, giving up after ``within``
        seconds whatever the client's socket timeout (used where an answer is useless
        past a deadline: renewals). Returns one result per call, a :class:`LockError` in
        place of a refused one; raises ``LockBackendUnavailable`` when no answer came in
        time (the connection is then closed, so the next attempt runs on a fresh one)."""
        deadline = time.monotonic() + max(within, 0.001)
        results: list[Any] = [None] * len(calls)
        try:
            topology = self.backend.topology()
            groups: dict[Node, list[int]] = {}
            for i, call in enumerate(calls):
                groups.setdefault(topology.node_for(call.keys[0]), []).append(i)
            for node, indexes in groups.items():
                replies = self._scripts_on(node, [calls[i] for i in indexes], deadline)
                for i, reply in zip(indexes, replies, strict=True):
                    if _is_redirect(reply):  # a slot migrates: follow it, alone
                        reply = self._routed(calls[i].keys[0], calls[i])[0]
                    results[i] = (
                        failure(self.name, reply) if isinstance(reply, BaseException) else reply
                    )
        except BACKEND_ERRORS as exc:
            raise unavailable(self.name, exc) from exc
        return results

    def pipeline(self, node: Node, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run plain ``commands`` pipelined on ``node``; an error reply takes the place of
        its result."""
        try:
            return self._pipelined(node, commands, None)
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    def _scripts_on(self, node: Node, calls: list[Call], deadline: float) -> list[Any]:
        replies = self._pipelined(node, [_eval_args(c, by_sha=True) for c in calls], deadline)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            loaded = self._pipelined(
                node, [_eval_args(calls[i], by_sha=False) for i in missing], deadline
            )
            for i, reply in zip(missing, loaded, strict=True):
                replies[i] = reply
        return replies

    def _pipelined(
        self, node: Node, commands: Sequence[tuple[Any, ...]], deadline: float | None
    ) -> list[Any]:
        pool = node.pool
        try:
            connection = pool.get(None if deadline is None else deadline - time.monotonic())
        except (ConnectionError, OSError):
            self.backend.node_failed(node)
            raise
        try:
            connection.send_packed_command([b"".join(map(pack, commands))])
            replies: list[Any] = []
            for _ in commands:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not connection.can_read(timeout=left):
                        raise TimeoutError("no answer in time")
                try:
                    replies.append(connection.read_response())
                except ResponseError as exc:
                    replies.append(exc)
        except BaseException as exc:
            pool.discard(connection)
            if isinstance(exc, ConnectionError | OSError):
                self.backend.node_failed(node)
            raise
        pool.put(connection)
        return replies

    # -- steps --------------------------------------------------------------------------

    def run(self, steps: Generator[Op, Any, T]) -> T:
        """Carry out ``steps`` and return their result. Any exception met on the way,
        ``KeyboardInterrupt`` included, is thrown into the steps so they can clean up."""
        result: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    op = steps.throw(error) if error is not None else steps.send(result)
                except StopIteration as stop:
                    return stop.value
                error = None
                try:
                    result = self._do(op)
                except BaseException as exc:  # noqa: BLE001 - handed to the steps
                    error = exc
        finally:
            self._drop_wait()

    def _do(self, op: Op) -> Any:
        if isinstance(op, Call):
            return self.call(op)
        try:
            if isinstance(op, StartWait):
                return self._start_wait(op)
            if isinstance(op, AwaitWait):
                return self._await_wait(op)
            if isinstance(op, CallEndingWait):
                return self._call_ending_wait(op)
        except BACKEND_ERRORS as exc:
            self._drop_wait()
            raise failure(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    def _start_wait(self, op: StartWait) -> None:
        self._open_wait(self.backend.topology().node_for(op.keys[0]), op.keys, asking=False)

    def _open_wait(self, node: Node, keys: tuple[str, ...], *, asking: bool) -> None:
        connection = node.pool.get()
        self._wait, self._wait_node, self._wait_keys = connection, node, keys
        self._wait_asking, self._wait_lost = asking, False
        self._send_blpop(connection)

    def _send_blpop(self, connection: Any) -> None:
        blpop = ("BLPOP", *self._wait_keys, self.backend.tuning.server_wait)
        if self._wait_asking:
            connection.send_packed_command(connection.pack_commands([("ASKING",), blpop]))
            connection.read_response()
        else:
            connection.send_command(*blpop)

    def _await_wait(self, op: AwaitWait) -> bool:
        started = time.monotonic()
        deadline = started + op.timeout
        attempt = 0
        while self._wait.can_read(timeout=max(deadline - time.monotonic(), 0.0)):
            try:
                reply = self._wait.read_response()
            except ResponseError as exc:  # a redirect: the wait's slot is migrating
                keys = self._wait_keys
                self._finish_wait()
                redirect = redirect_of(self.backend.topology(), keys[0], exc, attempt, started)
                if redirect is None:
                    raise
                attempt += 1
                time.sleep(min(redirect.delay, max(deadline - time.monotonic(), 0.0)))
                self._open_wait(redirect.node, keys, asking=redirect.asking)
                continue
            if not _ended_wait_mark(reply):
                self._finish_wait()
                return True
            self._send_blpop(self._wait)  # a mark left by an earlier wait: wait on
        return False

    def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection = self._wait
        if connection is None:
            # The wait already ended with its connection: it may have consumed a wake-up.
            return self.call(op.call), self._wait_lost
        try:
            reply, node = self._routed(op.call.keys[0], op.call)
        except BACKEND_ERRORS as exc:
            self._drop_wait()
            raise failure(self.name, exc) from exc
        except BaseException:
            self._drop_wait()
            raise
        if node is not self._wait_node:
            self._drop_wait()  # the end mark went to the node the slot moved to
            return reply, True
        try:
            answer = connection.read_response(timeout=_reply_timeout(connection))
        except BACKEND_ERRORS:
            self._drop_wait()
            return reply, True
        self._finish_wait()
        return reply, not _ended_wait_mark(answer)

    def _finish_wait(self) -> None:
        connection, node = self._wait, self._wait_node
        self._wait = self._wait_node = None
        if node is not None:
            node.pool.put(connection)

    def _drop_wait(self) -> None:
        connection, node = self._wait, self._wait_node
        self._wait = self._wait_node = None
        if connection is not None and node is not None:
            self._wait_lost = True
            node.pool.discard(connection)


class AsyncDriver:
    """Runs steps with the backend's async connections for the running loop.

    A ``finishing`` driver (a release) carries every request through to its answer even
    if the calling task is cancelled meanwhile, in that task, without a task of its own:
    a cancellation that interrupts reading a reply is put off and the reply read on
    (redis-py's parsers keep what they read of a reply across a cancelled read), one that
    interrupts anything before the request is written starts that part again. The
    cancellation stays counted on the task (``Task.cancelling()``) for the caller to
    raise once the steps are done.
    """

    __slots__ = (
        "_read",
        "_wait",
        "_wait_asking",
        "_wait_keys",
        "_wait_lost",
        "_wait_node",
        "backend",
        "finishing",
        "name",
    )

    def __init__(self, backend: Backend, name: str | None, *, finishing: bool = False) -> None:
        self.backend = backend
        self.name = name
        self.finishing = finishing
        self._wait: Any = None
        self._wait_node: Node | None = None
        self._wait_keys: tuple[str, ...] = ()
        self._wait_asking = False
        self._wait_lost = False
        self._read: asyncio.Task[Any] | None = None

    # -- single calls -----------------------------------------------------------------

    async def call(self, call: Call) -> Any:
        """Async twin of :meth:`SyncDriver.call`."""
        task, requested = _cancellations()
        reply = await self._call(call)
        if not self.finishing:  # a release's caller re-raises it once it is recorded
            _keep_cancellation(task, requested)
        return reply

    async def _call(self, call: Call) -> Any:
        """:meth:`call` without its cancellation check (:meth:`run` makes its own)."""
        try:
            return (await self._routed(call.keys[0], call))[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    async def execute(self, key: str, *command: Any) -> Any:
        """Async twin of :meth:`SyncDriver.execute`."""
        task, requested = _cancellations()
        try:
            reply = (await self._routed(key, command))[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        if not self.finishing:  # a release's caller re-raises it once it is recorded
            _keep_cancellation(task, requested)
        return reply

    async def _routed(self, key: str, request: Call | tuple[Any, ...]) -> tuple[Any, Node]:
        topology = self.backend.loop_topology()
        if topology is None:
            topology = await self._finished(self.backend.atopology)
        node = topology.node_for(key)
        asking = False
        attempt = 0
        started = time.monotonic()
        while True:
            try:
                return await self._on(node, request, asking), node
            except ResponseError as exc:
                redirect = redirect_of(topology, key, exc, attempt, started)
                if redirect is None:
                    _after_refusal(node, exc)
                    raise
                node, asking = redirect.node, redirect.asking
                if redirect.delay:
                    await self._finished(asyncio.sleep, redirect.delay)
                attempt += 1
            except _NotConnected as failed:
                self.backend.node_failed(node)
                node = await self._failed_over(key, node, failed)
                attempt += 1
            except (ConnectionError, OSError):
                self.backend.node_failed(node)
                raise

    async def _failed_over(self, key: str, node: Node, failed: _NotConnected) -> Node:
        """Async twin of :meth:`SyncDriver._failed_over`."""
        topology = await self._finished(self.backend.atopology)
        moved_to = topology.node_for(key) if topology.is_cluster else node
        if moved_to is node:
            raise failed.error
        return moved_to

    async def _on(self, node: Node, request: Call | tuple[Any, ...], asking: bool) -> Any:
        pool = node.async_pool()
        try:
            connection = await self._finished(pool.get)
        except (ConnectionError, OSError) as exc:
            raise _NotConnected(exc) from exc
        pool.begin(connection)
        try:
            if isinstance(request, Call):
                reply = await self._script_on(connection, request, asking, pool)
            else:
                commands = [("ASKING",), request] if asking else [request]
                sent = self._send(connection, b"".join(map(pack, commands)), pool)
                if sent is not None:
                    await sent
                if asking:
                    await self._reply(connection, pool)
                reply = await self._reply(connection, pool)
        except ResponseError:
            pool.end(connection)
            if not pool.keep(connection):
                await self._finished(pool.discard, connection)
            raise
        except BaseException as exc:
            expired = pool.expired(connection)
            timed_out = pool.end(connection)
            await completed(pool.discard(connection))
            if timed_out or (expired and self.finishing):
                raise pool.timed_out() from exc
            raise
        pool.end(connection)
        if not pool.keep(connection):
            await self._finished(pool.discard, connection)
        return reply

    async def _script_on(
        self, connection: Any, call: Call, asking: bool, pool: AsyncConnectionPool
    ) -> Any:
        """Async twin of :func:`_script_on`."""
        for by_sha in (True, False):
            request = _request(call, by_sha=by_sha, asking=asking)
            if (sent := self._send(connection, request, pool)) is not None:
                await sent
            if asking:
                await self._reply(connection, pool)
            try:
                reply = await self._reply(connection, pool)
            except NoScriptError:
                if call.replicas is not None:
                    await self._reply(connection, pool)
                continue
            if call.replicas is None:
                return reply
            return Replicated(reply, int(await self._reply(connection, pool)))
        raise ResponseError("script could not be loaded")  # pragma: no cover

    def _send(
        self, connection: Any, data: bytes, pool: AsyncConnectionPool
    ) -> Awaitable[None] | None:
        """Write ``data`` (packed commands) in one request; what to await, if anything.
        Directly to the stream when :func:`.wire.direct` allows. A cancelled write sent
        nothing (redis-py closes the connection; writing again reconnects), so a finishing
        driver writes again (unless the request outlived the pool's timeout). Plain
        methods returning what to await, here and in :meth:`_reply`: a coroutine less per
        step."""
        if direct(connection):
            return write(connection, data, self._keep_on(connection, pool))
        # redis-py's health check is a coroutine even when off: skipped then.
        check_health = bool(connection.health_check_interval)
        return self._finished(
            connection.send_packed_command, data, check_health, expired=(pool, connection)
        )

    def _reply(self, connection: Any, pool: AsyncConnectionPool) -> Awaitable[Any]:
        """The next reply on ``connection``. Read with ``disconnect_on_error=False``: the
        caller closes a connection that failed, and a finishing driver reads on after a
        cancellation (unless the request outlived the pool's timeout)."""
        if direct(connection):
            return read_reply(connection, self._keep_on(connection, pool))
        if not self.finishing:
            return connection.read_response(disconnect_on_error=False)
        read = functools.partial(connection.read_response, disconnect_on_error=False)
        return carried(read, (), self._keep_on(connection, pool))

    def _keep_on(self, connection: Any, pool: AsyncConnectionPool) -> Callable[[], bool] | None:
        """For a finishing driver: while to carry a request on ``connection`` through
        cancellations (until it outlives the pool's timeout); None for any other."""
        if not self.finishing:
            return None
        return lambda: not pool.expired(connection)

    def _finished(
        self,
        start: Callable[..., Awaitable[T]],
        *args: Any,
        expired: tuple[AsyncConnectionPool, Any] | None = None,
    ) -> Awaitable[T]:
        """``start(*args)``; for a finishing driver, started again when the task is
        cancelled meanwhile (given only what can start over: nothing was sent yet), unless
        that cancellation is the timeout of the request on ``expired``'s connection."""
        if not self.finishing:
            return start(*args)
        keep_on = _always if expired is None else self._keep_on(expired[1], expired[0])
        return carried(start, args, keep_on)

    # -- pipelines ----------------------------------------------------------------------

    async def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Async twin of :meth:`SyncDriver.call_many`."""
        results: list[Any] = [None] * len(calls)
        task, requested = _cancellations()
        try:
            async with asyncio.timeout(max(within, 0.001)):
                topology = await self.backend.atopology()
                groups: dict[Node, list[int]] = {}
                for i, call in enumerate(calls):
                    groups.setdefault(topology.node_for(call.keys[0]), []).append(i)
                for node, indexes in groups.items():
                    replies = await self._scripts_on(node, [calls[i] for i in indexes])
                    for i, reply in zip(indexes, replies, strict=True):
                        if _is_redirect(reply):
                            reply = (await self._routed(calls[i].keys[0], calls[i]))[0]
                        results[i] = (
                            failure(self.name, reply) if isinstance(reply, BaseException) else reply
                        )
        except (*BACKEND_ERRORS, TimeoutError) as exc:
            raise unavailable(self.name, exc) from exc
        _keep_cancellation(task, requested)
        return results

    async def pipeline(self, node: Node, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Async twin of :meth:`SyncDriver.pipeline`."""
        task, requested = _cancellations()
        try:
            replies = await self._pipelined(node, commands)
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        _keep_cancellation(task, requested)
        return replies

    async def _scripts_on(self, node: Node, calls: list[Call]) -> list[Any]:
        replies = await self._pipelined(node, [_eval_args(c, by_sha=True) for c in calls])
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            loaded = await self._pipelined(
                node, [_eval_args(calls[i], by_sha=False) for i in missing]
            )
            for i, reply in zip(missing, loaded, strict=True):
                replies[i] = reply
        return replies

    async def _pipelined(self, node: Node, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        pool = node.async_pool()
        try:
            connection = await pool.get()
        except (ConnectionError, OSError):
            self.backend.node_failed(node)
            raise
        scope = asyncio.timeout(pool.timeout)
        try:
            async with scope:
                await connection.send_packed_command([b"".join(map(pack, commands))])
                replies: list[Any] = []
                for _ in commands:
                    try:
                        replies.append(await connection.read_response(disconnect_on_error=False))
                    except ResponseError as exc:
                        replies.append(exc)
        except BaseException as exc:
            await completed(pool.discard(connection))
            if scope.expired() and isinstance(exc, TimeoutError):
                raise pool.timed_out() from exc
            if isinstance(exc, ConnectionError | OSError):
                self.backend.node_failed(node)
            raise
        await pool.put(connection)
        return replies

    # -- steps --------------------------------------------------------------------------

    async def run(self, steps: Generator[Op, Any, T]) -> T:
        """Carry out ``steps``. A cancellation is thrown into the steps; the clean-up
        steps they then ask for run to completion, and the task stays cancelled."""
        result: Any = None
        error: BaseException | None = None
        cancelled = False
        task, requested = _cancellations()
        try:
            while True:
                try:
                    op = steps.throw(error) if error is not None else steps.send(result)
                except StopIteration as stop:
                    if cancelled:
                        raise asyncio.CancelledError from None
                    return stop.value
                error = None
                try:
                    if cancelled:
                        result, _ = await completed(self._do(op))
                    else:
                        result = await self._do(op)
                        if not self.finishing:
                            _keep_cancellation(task, requested)
                except BaseException as exc:  # noqa: BLE001 - handed to the steps
                    cancelled = cancelled or isinstance(exc, asyncio.CancelledError)
                    error = exc
        finally:
            if self._wait is not None:
                await completed(self._drop_wait())

    async def _do(self, op: Op) -> Any:
        if type(op) is Call:
            return await self._call(op)
        try:
            if isinstance(op, StartWait):
                return await self._start_wait(op)
            if isinstance(op, AwaitWait):
                return await self._await_wait(op)
            if isinstance(op, CallEndingWait):
                return await self._call_ending_wait(op)
        except BACKEND_ERRORS as exc:
            await self._drop_wait()
            raise failure(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    async def _start_wait(self, op: StartWait) -> None:
        topology = await self.backend.atopology()
        await self._open_wait(topology.node_for(op.keys[0]), op.keys, asking=False)

    async def _open_wait(self, node: Node, keys: tuple[str, ...], *, asking: bool) -> None:
        connection = await node.async_pool().get()
        self._wait, self._wait_node, self._wait_keys = connection, node, keys
        self._wait_asking, self._wait_lost = asking, False
        await self._send_blpop(connection)

    async def _send_blpop(self, connection: Any) -> None:
        server_wait = self.backend.tuning.server_wait
        blpop = ("BLPOP", *self._wait_keys, server_wait)
        if self._wait_asking:
            assert self._wait_node is not None
            async with asyncio.timeout(self._wait_node.async_pool().timeout):
                await connection.send_packed_command(connection.pack_commands([("ASKING",), blpop]))
                await connection.read_response()
        else:
            await connection.send_command(*blpop)
        self._read = asyncio.ensure_future(connection.read_response(timeout=server_wait + 5))

    async def _await_wait(self, op: AwaitWait) -> bool:
        started = time.monotonic()
        deadline = started + op.timeout
        attempt = 0
        while True:
            read = self._read
            assert read is not None
            done, _ = await asyncio.wait({read}, timeout=max(deadline - time.monotonic(), 0.0))
            if not done:
                return False
            try:
                reply = read.result()
            except ResponseError as exc:  # a redirect: the wait's slot is migrating
                keys = self._wait_keys
                await self._finish_wait()
                redirect = redirect_of(
                    await self.backend.atopology(), keys[0], exc, attempt, started
                )
                if redirect is None:
                    raise
                attempt += 1
                await asyncio.sleep(min(redirect.delay, max(deadline - time.monotonic(), 0.0)))
                await self._open_wait(redirect.node, keys, asking=redirect.asking)
                continue
            if not _ended_wait_mark(reply):
                await self._finish_wait()
                return True
            await self._send_blpop(self._wait)  # a mark left by an earlier wait: wait on

    async def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection, read = self._wait, self._read
        if connection is None or read is None:
            return await self.call(op.call), self._wait_lost
        try:
            reply, node = await self._routed(op.call.keys[0], op.call)
        except BACKEND_ERRORS as exc:
            await completed(self._drop_wait())
            raise failure(self.name, exc) from exc
        except BaseException:
            await completed(self._drop_wait())
            raise
        if node is not self._wait_node:
            await self._drop_wait()
            return reply, True
        try:
            answer = await asyncio.wait_for(
                asyncio.shield(read), node.async_pool().timeout or _END_WAIT_REPLY_TIMEOUT
            )
        except (*BACKEND_ERRORS, TimeoutError):
            await self._drop_wait()
            return reply, True
        await self._finish_wait()
        return reply, not _ended_wait_mark(answer)

    async def _finish_wait(self) -> None:
        connection, node = self._wait, self._wait_node
        self._wait = self._wait_node = self._read = None
        if node is not None:
            await node.async_pool().put(connection)

    async def _drop_wait(self) -> None:
        connection, node, read = self._wait, self._wait_node, self._read
        self._wait = self._wait_node = self._read = None
        if read is not None and not read.done():
            read.cancel()
        if connection is not None and node is not None:
            self._wait_lost = True
            await node.async_pool().discard(connection)


def _request(call: Call, *, by_sha: bool, asking: bool) -> bytes:
    """What to send for ``call``, packed: ``ASKING`` first when redirected by ``ASK``, the
    script, then ``WAIT`` when it must reach replicas."""
    script = pack_call(call) if by_sha else pack(_eval_args(call, by_sha=False))
    if not asking and call.replicas is None:
        return script
    parts = [pack(("ASKING",))] if asking else []
    parts.append(script)
    if call.replicas is not None:
        parts.append(pack(("WAIT", *call.replicas)))
    return b"".join(parts)


def _script_on(connection: Any, call: Call, asking: bool) -> Any:
    """Run ``call`` on ``connection`` (``EVALSHA``, then ``EVAL`` on ``NOSCRIPT``), in one
    round trip with its ``ASKING`` and ``WAIT``."""
    for by_sha in (True, False):
        connection.send_packed_command([_request(call, by_sha=by_sha, asking=asking)])
        if asking:
            connection.read_response()
        try:
            reply = connection.read_response()
        except NoScriptError:
            if call.replicas is not None:
                connection.read_response()
            continue
        if call.replicas is None:
            return reply
        return Replicated(reply, int(connection.read_response()))
    raise ResponseError("script could not be loaded")  # pragma: no cover


def _always() -> bool:
    """Carry an operation through every cancellation (see :func:`.wire.carried`)."""
    return True


def _cancellations() -> tuple[asyncio.Task[Any] | None, int]:
    """The running task and how many cancellations of it are pending now."""
    task = asyncio.current_task()
    return task, 0 if task is None else task.cancelling()


def _keep_cancellation(task: asyncio.Task[Any] | None, requested: int) -> None:
    """Raise ``CancelledError`` if ``task`` was cancelled since it had ``requested``
    cancellations pending, although nothing raised it: the client library lost it.

    On Python 3.11 ``asyncio.wait_for`` returns the result when the cancellation arrives
    as the awaited operation finishes, and redis-py awaits every write that way when the
    connection has a socket timeout. The task would go on as if never cancelled, with a
    lock it was cancelled while taking.
    """
    if task is not None and task.cancelling() > requested:
        raise asyncio.CancelledError


async def completed(awaitable: Awaitable[T]) -> tuple[T, bool]:
    """Await ``awaitable`` to the end even if the caller is cancelled meanwhile.

    Returns its result and whether a cancellation arrived; the caller re-raises it once
    its own bookkeeping is done, so cancelled tasks stay cancelled.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
            if task.done():
                return task.result(), cancelled
