"""The two I/O shells: they carry out the steps of :mod:`.core` with a sync or an async
Redis client. Everything they know about locks is in the steps they are given.

Every Redis or socket failure leaves here as :class:`LockBackendUnavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError, NoScriptError, RedisError, ResponseError

from .core import AwaitWait, Call, CallEndingWait, CancelWait, Op, StartWait
from .exceptions import LockBackendUnavailable

if TYPE_CHECKING:
    from .backend import Backend

__all__ = ["AsyncDriver", "SyncDriver", "unavailable"]

T = TypeVar("T")

BACKEND_ERRORS = (RedisError, OSError)


def unavailable(name: str | None, exc: BaseException) -> LockBackendUnavailable:
    """The error a caller sees for a failed Redis call."""
    return LockBackendUnavailable(
        f"Redis unavailable for lock {name!r}: {type(exc).__name__}: {exc}", name=name
    )


def _pool_exhausted(exc: BaseException) -> bool:
    # MaxConnectionsError on redis-py 6+, a plain ConnectionError before.
    return isinstance(exc, ConnectionError) and "Too many connections" in str(exc)


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


def _eval_args(call: Call, *, by_sha: bool) -> tuple[Any, ...]:
    head = ("EVALSHA", call.script.sha) if by_sha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


class SyncDriver:
    """Runs steps with a ``redis.Redis`` client (and the backend's wait pool)."""

    __slots__ = ("_wait", "backend", "name")

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: Any = None

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
                return self._eval(self.backend.overflow_client(), call)
        except BACKEND_ERRORS as exc:
            raise unavailable(self.name, exc) from exc

    @staticmethod
    def _eval(client: Any, call: Call) -> Any:
        try:
            return client.execute_command(*_eval_args(call, by_sha=True))
        except NoScriptError:
            return client.execute_command(*_eval_args(call, by_sha=False))

    def call_within(self, call: Call, timeout: float) -> Any:
        """Run one script, giving up after ``timeout`` seconds whatever the client's
        socket timeout (used where an answer is useless past a deadline: renewals, from
        the watchdog thread only, on the backend's renewal connection)."""
        connection = self.backend.renewal_connection()
        try:
            _connect_within(connection, timeout)
            for by_sha in (True, False):
                connection.send_command(*_eval_args(call, by_sha=by_sha))
                if not connection.can_read(timeout=max(timeout, 0.0)):
                    connection.disconnect()
                    raise TimeoutError(f"no answer within {timeout:.3f}s")
                try:
                    return connection.read_response()
                except NoScriptError:
                    continue
            raise ResponseError("script could not be loaded")  # pragma: no cover
        except BACKEND_ERRORS as exc:
            connection.disconnect()
            raise unavailable(self.name, exc) from exc

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
            if isinstance(op, CancelWait):
                return self._cancel_wait()
            if isinstance(op, CallEndingWait):
                return self._call_ending_wait(op)
        except BACKEND_ERRORS as exc:
            self._drop_wait()
            raise unavailable(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection = self._wait
        if connection is None or connection.distlock_client_id is None:
            self._drop_wait()
            return self.call(op.call), connection is not None
        pool = self.backend.wait_pool()
        other = pool.get_connection()
        try:
            other.send_command("CLIENT", "UNBLOCK", connection.distlock_client_id)
            reply = self.call(op.call)
            other.read_response()
        except BaseException:
            other.disconnect()
            self._drop_wait()
            raise
        finally:
            pool.release(other)
        woken = connection.read_response() is not None
        self._finish_wait()
        return reply, woken

    def _start_wait(self, op: StartWait) -> None:
        pool = self.backend.wait_pool()
        connection = pool.get_connection()
        self._wait = connection
        connection.send_command("BLPOP", op.key, self.backend.tuning.server_wait)

    def _await_wait(self, op: AwaitWait) -> bool:
        connection = self._wait
        if not connection.can_read(timeout=op.timeout):
            return False
        connection.read_response()
        self._finish_wait()
        return True

    def _cancel_wait(self) -> bool:
        connection = self._wait
        if connection is None:
            return False  # the wait already ended with its connection (server gone)
        if connection.distlock_client_id is None:
            self._drop_wait()
            return True
        pool = self.backend.wait_pool()
        other = pool.get_connection()
        try:
            other.send_command("CLIENT", "UNBLOCK", connection.distlock_client_id)
            other.read_response()
        except ResponseError:
            # CLIENT UNBLOCK not permitted here: drop the connection instead, and assume
            # it may have consumed a wake-up (a spare one only causes a re-check).
            self._drop_wait()
            return True
        finally:
            pool.release(other)
        reply = connection.read_response()
        self._finish_wait()
        return reply is not None

    def _finish_wait(self) -> None:
        connection, self._wait = self._wait, None
        self.backend.wait_pool().release(connection)

    def _drop_wait(self) -> None:
        connection, self._wait = self._wait, None
        if connection is not None:
            connection.disconnect()
            self.backend.wait_pool().release(connection)


class AsyncDriver:
    """Runs steps with a ``redis.asyncio.Redis`` client of the running loop."""

    __slots__ = ("_read", "_wait", "backend", "name")

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: Any = None
        self._read: asyncio.Task[Any] | None = None

    async def call(self, call: Call) -> Any:
        """Run one script (``EVALSHA``, loading it on ``NOSCRIPT``); like
        :meth:`SyncDriver.call`, overflowing onto the backend's own pool if the client's
        pool is exhausted."""
        try:
            try:
                return await self._eval(self.backend.async_client(), call)
            except ConnectionError as exc:
                if not _pool_exhausted(exc):
                    raise
                return await self._eval(self.backend.async_overflow_client(), call)
        except BACKEND_ERRORS as exc:
            raise unavailable(self.name, exc) from exc

    @staticmethod
    async def _eval(client: Any, call: Call) -> Any:
        try:
            return await client.execute_command(*_eval_args(call, by_sha=True))
        except NoScriptError:
            return await client.execute_command(*_eval_args(call, by_sha=False))

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
            if isinstance(op, CancelWait):
                return await self._cancel_wait()
            if isinstance(op, CallEndingWait):
                return await self._call_ending_wait(op)
        except BACKEND_ERRORS as exc:
            await self._drop_wait()
            raise unavailable(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    async def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        connection, read = self._wait, self._read
        if connection is None or read is None or connection.distlock_client_id is None:
            await self._drop_wait()
            return await self.call(op.call), connection is not None
        pool = self.backend.async_wait_pool()
        other = await pool.get_connection()
        try:
            await other.send_command("CLIENT", "UNBLOCK", connection.distlock_client_id)
            reply = await self.call(op.call)
            await other.read_response()
        except BaseException:
            await other.disconnect()
            await self._drop_wait()
            raise
        finally:
            await pool.release(other)
        woken = (await read) is not None
        await self._finish_wait()
        return reply, woken

    async def _start_wait(self, op: StartWait) -> None:
        pool = self.backend.async_wait_pool()
        connection = await pool.get_connection()
        self._wait = connection
        server_wait = self.backend.tuning.server_wait
        await connection.send_command("BLPOP", op.key, server_wait)
        self._read = asyncio.ensure_future(connection.read_response(timeout=server_wait + 5))

    async def _await_wait(self, op: AwaitWait) -> bool:
        read = self._read
        assert read is not None
        done, _ = await asyncio.wait({read}, timeout=op.timeout)
        if not done:
            return False
        read.result()
        await self._finish_wait()
        return True

    async def _cancel_wait(self) -> bool:
        connection, read = self._wait, self._read
        if connection is None or read is None:
            return False  # the wait already ended with its connection (server gone)
        if connection.distlock_client_id is None:
            await self._drop_wait()
            return True
        pool = self.backend.async_wait_pool()
        other = await pool.get_connection()
        try:
            await other.send_command("CLIENT", "UNBLOCK", connection.distlock_client_id)
            await other.read_response()
        except ResponseError:
            await self._drop_wait()
            return True
        finally:
            await pool.release(other)
        reply = await read
        await self._finish_wait()
        return reply is not None

    async def _finish_wait(self) -> None:
        connection, self._wait, self._read = self._wait, None, None
        await self.backend.async_wait_pool().release(connection)

    async def _drop_wait(self) -> None:
        connection, read = self._wait, self._read
        self._wait = self._read = None
        if read is not None and not read.done():
            read.cancel()
        if connection is not None:
            await connection.disconnect()
            await self.backend.async_wait_pool().release(connection)


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
