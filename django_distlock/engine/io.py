"""The two I/O shells: they carry out the steps of :mod:`.core` with a sync or an async
Redis client. Everything they know about locks is in the steps they are given.

Every Redis or socket failure leaves here as a :class:`LockError`: the server could not
be reached or cannot serve right now (:class:`LockBackendUnavailable`), or it answered
with an error retrying will not cure (:class:`LockBackendError`).

Why this module is long: the two drivers mirror each other method by method, and
reading them side by side is what keeps them mirrored (redis-py's separate sync and
async lock files drifted apart). Only their I/O differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from .core import AwaitWait, Call, CallEndingWait, Op, StartWait
from .exceptions import LockBackendError, LockBackendUnavailable, LockError

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "BACKEND_ERRORS",
    "AsyncDriver",
    "SyncDriver",
    "completed",
    "failure",
    "unavailable",
]

T = TypeVar("T")

BACKEND_ERRORS = (RedisError, OSError)

# Error replies that mean "not now" rather than "never": a replica that is not (yet) the
# primary, a server loading its data or busy with a script, out of memory, a cluster
# without a quorum, too few replicas for min-replicas-to-write.
_TRANSIENT_REPLIES = (ReadOnlyError, ClusterDownError, TryAgainError, OutOfMemoryError)
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


def _pool_exhausted(exc: BaseException) -> bool:
    # MaxConnectionsError on redis-py 6+, a plain ConnectionError before.
    return isinstance(exc, ConnectionError) and "Too many connections" in str(exc)


def _eval_args(call: Call, *, by_sha: bool) -> tuple[Any, ...]:
    head = ("EVALSHA", call.script.sha) if by_sha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


def _ended_wait_mark(reply: Any) -> bool:
    """True for a BLPOP answer that is an end-of-wait mark, not a wake-up."""
    return isinstance(reply, list | tuple) and reply[1] in (b"c", "c")


def _reply_timeout(connection: Any) -> float:
    return connection.socket_timeout or _END_WAIT_REPLY_TIMEOUT


def _answers(replies: list[Any], name: str | None) -> tuple[list[Any], list[int]]:
    """Map pipelined replies to results or :class:`LockError`; return them and the indexes
    of the calls to send again as ``EVAL`` (their script was not loaded)."""
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    results = [
        failure(name, reply) if isinstance(reply, ResponseError) else reply for reply in replies
    ]
    return results, missing


class SyncDriver:
    """Runs steps with a ``redis.Redis`` client (and the backend's own connections)."""

    __slots__ = ("_wait", "_wait_keys", "_wait_lost", "backend", "name")

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: Any = None
        self._wait_keys: tuple[str, ...] = ()
        self._wait_lost = False  # a BLPOP was dropped without reading its answer

    def call(self, call: Call) -> Any:
        """Run one script (``EVALSHA``, loading it on ``NOSCRIPT``).

        If the client's pool is exhausted (many threads at once against a small
        ``max_connections``), the call runs on the backend's own pool instead: a lock
        operation must not fail for want of a pooled connection.
        """
        try:
            try:
                return self._eval(self.backend.client, call)
            except ConnectionError as exc:
                if not _pool_exhausted(exc):
                    raise
                return self._eval_on_own_connection(call)
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    @staticmethod
    def _eval(client: Any, call: Call) -> Any:
        try:
            return client.execute_command(*_eval_args(call, by_sha=True))
        except NoScriptError:
            return client.execute_command(*_eval_args(call, by_sha=False))

    def _eval_on_own_connection(self, call: Call) -> Any:
        pool = self.backend.pool()
        connection = pool.get()
        try:
            connection.send_command(*_eval_args(call, by_sha=True))
            try:
                reply = connection.read_response()
            except NoScriptError:
                connection.send_command(*_eval_args(call, by_sha=False))
                reply = connection.read_response()
        except BaseException:
            pool.discard(connection)
            raise
        pool.put(connection)
        return reply

    def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Run ``calls`` pipelined in one round trip on a connection of the backend's own,
        giving up after ``within`` seconds whatever the client's socket timeout (used
        where an answer is useless past a deadline: renewals). Returns one result per
        call, a :class:`LockError` in place of a refused one; raises
        ``LockBackendUnavailable`` when no answer came in time (the connection is then
        closed, so the next attempt runs on a fresh one)."""
        deadline = time.monotonic() + max(within, 0.001)
        pool = self.backend.pool()
        connection = pool.get()
        try:
            _connect_within(connection, deadline - time.monotonic())
            results: list[Any] = [None] * len(calls)
            pending = list(range(len(calls)))
            by_sha = True
            while pending:
                batch = [calls[i] for i in pending]
                connection.send_packed_command(
                    connection.pack_commands([_eval_args(c, by_sha=by_sha) for c in batch])
                )
                replies = []
                for _ in batch:
                    left = deadline - time.monotonic()
                    if left <= 0 or not connection.can_read(timeout=left):
                        raise TimeoutError(f"no answer within {within:.3f}s")
                    try:
                        replies.append(connection.read_response(timeout=max(left, 0.001)))
                    except ResponseError as exc:
                        replies.append(exc)
                answers, missing = _answers(replies, self.name)
                for i, answer in zip(pending, answers, strict=True):
                    results[i] = answer
                pending = [pending[j] for j in missing] if by_sha else []
                by_sha = False
        except BACKEND_ERRORS as exc:
            pool.discard(connection)
            raise unavailable(self.name, exc) from exc
        except BaseException:
            pool.discard(connection)
            raise
        pool.put(connection)
        return results

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
        connection = self.backend.pool().get()
        self._wait, self._wait_keys, self._wait_lost = connection, op.keys, False
        self._send_blpop(connection)

    def _send_blpop(self, connection: Any) -> None:
        connection.send_command("BLPOP", *self._wait_keys, self.backend.tuning.server_wait)

    def _await_wait(self, op: AwaitWait) -> bool:
        connection = self._wait
        deadline = time.monotonic() + op.timeout
        while connection.can_read(timeout=max(deadline - time.monotonic(), 0.0)):
            if not _ended_wait_mark(connection.read_response()):
                self._finish_wait()
                return True
            self._send_blpop(connection)  # a mark left by an earlier wait: wait on
        return False

    def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection = self._wait
        if connection is None:
            # The wait already ended with its connection: it may have consumed a wake-up.
            return self.call(op.call), self._wait_lost
        try:
            reply = self.call(op.call)
        except BaseException:
            self._drop_wait()
            raise
        try:
            answer = connection.read_response(timeout=_reply_timeout(connection))
        except BACKEND_ERRORS:
            self._drop_wait()
            return reply, True
        self._finish_wait()
        return reply, not _ended_wait_mark(answer)

    def _finish_wait(self) -> None:
        connection, self._wait = self._wait, None
        self.backend.pool().put(connection)

    def _drop_wait(self) -> None:
        connection, self._wait = self._wait, None
        if connection is not None:
            self._wait_lost = True
            self.backend.pool().discard(connection)


class AsyncDriver:
    """Runs steps with a ``redis.asyncio.Redis`` client of the running loop."""

    __slots__ = ("_read", "_wait", "_wait_keys", "_wait_lost", "backend", "name")

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: Any = None
        self._wait_keys: tuple[str, ...] = ()
        self._wait_lost = False
        self._read: asyncio.Task[Any] | None = None

    async def call(self, call: Call) -> Any:
        """Run one script (``EVALSHA``, loading it on ``NOSCRIPT``); like
        :meth:`SyncDriver.call`, overflowing onto the backend's own connections if the
        client's pool is exhausted."""
        try:
            try:
                return await self._eval(self.backend.async_client(), call)
            except ConnectionError as exc:
                if not _pool_exhausted(exc):
                    raise
                return await self._eval_on_own_connection(call)
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    @staticmethod
    async def _eval(client: Any, call: Call) -> Any:
        try:
            return await client.execute_command(*_eval_args(call, by_sha=True))
        except NoScriptError:
            return await client.execute_command(*_eval_args(call, by_sha=False))

    async def _eval_on_own_connection(self, call: Call) -> Any:
        pool = self.backend.async_pool()
        connection = pool.get()
        try:
            await connection.send_command(*_eval_args(call, by_sha=True))
            try:
                reply = await connection.read_response()
            except NoScriptError:
                await connection.send_command(*_eval_args(call, by_sha=False))
                reply = await connection.read_response()
        except BaseException:
            await completed(pool.discard(connection))
            raise
        await pool.put(connection)
        return reply

    async def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Async twin of :meth:`SyncDriver.call_many`."""
        pool = self.backend.async_pool()
        connection = pool.get()
        try:
            async with asyncio.timeout(max(within, 0.001)):
                results: list[Any] = [None] * len(calls)
                pending = list(range(len(calls)))
                by_sha = True
                while pending:
                    batch = [calls[i] for i in pending]
                    await connection.send_packed_command(
                        connection.pack_commands([_eval_args(c, by_sha=by_sha) for c in batch])
                    )
                    replies = []
                    for _ in batch:
                        try:
                            replies.append(await connection.read_response())
                        except ResponseError as exc:
                            replies.append(exc)
                    answers, missing = _answers(replies, self.name)
                    for i, answer in zip(pending, answers, strict=True):
                        results[i] = answer
                    pending = [pending[j] for j in missing] if by_sha else []
                    by_sha = False
        except (*BACKEND_ERRORS, TimeoutError) as exc:
            await completed(pool.discard(connection))
            raise unavailable(self.name, exc) from exc
        except BaseException:
            await completed(pool.discard(connection))
            raise
        await pool.put(connection)
        return results

    async def run(self, steps: Generator[Op, Any, T]) -> T:
        """Carry out ``steps``. A cancellation is thrown into the steps; the clean-up
        steps they then ask for run to completion, and the task stays cancelled."""
        result: Any = None
        error: BaseException | None = None
        cancelled = False
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
                except BaseException as exc:  # noqa: BLE001 - handed to the steps
                    cancelled = cancelled or isinstance(exc, asyncio.CancelledError)
                    error = exc
        finally:
            if self._wait is not None:
                await completed(self._drop_wait())

    async def _do(self, op: Op) -> Any:
        if isinstance(op, Call):
            return await self.call(op)
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
        connection = self.backend.async_pool().get()
        self._wait, self._wait_keys, self._wait_lost = connection, op.keys, False
        await self._send_blpop(connection)

    async def _send_blpop(self, connection: Any) -> None:
        server_wait = self.backend.tuning.server_wait
        await connection.send_command("BLPOP", *self._wait_keys, server_wait)
        self._read = asyncio.ensure_future(connection.read_response(timeout=server_wait + 5))

    async def _await_wait(self, op: AwaitWait) -> bool:
        deadline = time.monotonic() + op.timeout
        while True:
            read = self._read
            assert read is not None
            done, _ = await asyncio.wait({read}, timeout=max(deadline - time.monotonic(), 0.0))
            if not done:
                return False
            if not _ended_wait_mark(read.result()):
                await self._finish_wait()
                return True
            await self._send_blpop(self._wait)  # a mark left by an earlier wait: wait on

    async def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection, read = self._wait, self._read
        if connection is None or read is None:
            return await self.call(op.call), self._wait_lost
        try:
            reply = await self.call(op.call)
        except BaseException:
            await completed(self._drop_wait())
            raise
        try:
            answer = await asyncio.wait_for(asyncio.shield(read), _reply_timeout(connection))
        except (*BACKEND_ERRORS, TimeoutError):
            await self._drop_wait()
            return reply, True
        await self._finish_wait()
        return reply, not _ended_wait_mark(answer)

    async def _finish_wait(self) -> None:
        connection, self._wait, self._read = self._wait, None, None
        await self.backend.async_pool().put(connection)

    async def _drop_wait(self) -> None:
        connection, read = self._wait, self._read
        self._wait = self._read = None
        if read is not None and not read.done():
            read.cancel()
        if connection is not None:
            self._wait_lost = True
            await self.backend.async_pool().discard(connection)


def _connect_within(connection: Any, timeout: float) -> None:
    """Open ``connection`` if needed, taking at most ``timeout`` seconds for the connect
    and the handshake (a stalled server accepts TCP connections but never answers)."""
    if getattr(connection, "_sock", None) is not None:
        return
    saved = connection.socket_timeout, connection.socket_connect_timeout
    bound = max(timeout, 0.001)
    connection.socket_timeout = connection.socket_connect_timeout = bound
    try:
        connection.connect()
    finally:
        connection.socket_timeout, connection.socket_connect_timeout = saved
        sock = getattr(connection, "_sock", None)
        if sock is not None:
            sock.settimeout(saved[0])


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
