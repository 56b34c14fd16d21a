"""The I/O drivers: :class:`SyncDriver` carries out the protocol's steps
(:mod:`..protocol.steps`) on redis-py's sync connections, :class:`AsyncDriver` on its
asyncio connections for the running event loop, on the server that holds each key
(:mod:`.routes`). Everything they know about locks is in the steps they are given; what
every request shares (replies kept with their request, redirects, errors) is in
:mod:`.requests`, and they differ only in how they wait for Redis.

The async driver carries its operations through cancellation (:func:`completed`): a task
that was cancelled stays cancelled, and work that must finish (a release, a clean-up)
does, whatever happens to the task that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Coroutine, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import AskError, ConnectionError, NoScriptError, ResponseError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..protocol.ops import (
    AwaitWakeUp,
    Call,
    CallEndingWait,
    Op,
    Pause,
    StartWait,
    Wake,
    interrupted,
)
from .replication import READ_REPLICAS, resolved, wants_reading
from .requests import (
    BACKEND_ERRORS,
    NotSent,
    Redirect,
    Request,
    Routing,
    asend,
    by_server,
    commands_for,
    failure,
    unavailable,
    woken_by,
)

__all__ = [
    "END_WAIT_REPLY_TIMEOUT",
    "AsyncDriver",
    "SyncDriver",
    "cancellations",
    "completed",
    "keep_cancellation",
]


def cancellations() -> tuple[asyncio.Task[Any] | None, int]:
    """The running task and how many cancellations of it are pending now."""
    task = asyncio.current_task()
    return task, 0 if task is None else task.cancelling()


def keep_cancellation(task: asyncio.Task[Any] | None, requested: int) -> None:
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


if TYPE_CHECKING:
    from .backend import Backend
    from .routes import AsyncRoutes, AsyncServer, Routes, Server


T = TypeVar("T")


END_WAIT_REPLY_TIMEOUT = 10.0


"""How long the answer to a BLPOP that we just ended may take at most (it normally
arrives within a round trip)."""


class SyncDriver:
    """Runs steps with redis-py's sync connections."""

    __slots__ = ("_wait", "_wait_keys", "_woken_unseen", "backend", "name")

    def __init__(self, backend: Backend, name: str | None) -> None:
        self.backend = backend
        self.name = name
        self._wait: tuple[Server, Any] | None = None
        self._wait_keys: tuple[str, ...] = ()
        # The last wait consumed (or may have consumed) a wake-up that the steps have not
        # been told of: its answer was dropped unread, or read while the operation was
        # interrupted before the steps got it (a cancellation as the wait's connection
        # went back to its pool). A later CallEndingWait reports it, to be handed on.
        self._woken_unseen = False

    # -- single requests --------------------------------------------------------------

    def call(self, call: Call) -> Any:
        """Run one script (``EVALSHA``, ``EVAL`` after ``NOSCRIPT``) on the server holding
        its keys, following cluster redirects; with ``replicas``, its ``WAIT`` on the same
        connection (:class:`~..protocol.ops.Replicated`)."""
        try:
            return self._routed(call.keys[0], call)[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    def execute(self, key: str, *command: Any) -> Any:
        """Run one plain command on the server holding ``key``."""
        try:
            return self._routed(key, command)[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    def _routed(self, key: str, request: Request) -> tuple[Any, Server]:
        routes = self.backend.routes()
        server = routes.for_key(key)
        routing = Routing(request)
        while True:
            try:
                routing.request = self._replicas_on(server, request)
                replies = server.request(routing.commands())
            except NotSent as failed:
                self.backend.replica_counts.lost(server.name)
                routing.not_sent(failed)
                server = _elsewhere(routes, key, server, failed.error)
                continue
            except (ConnectionError, OSError) as exc:
                self.backend.replica_counts.lost(server.name)
                delay = routing.failed(exc)
                if delay is None:
                    _refresh(routes)
                    raise
                routes.reset_idle()  # each idle connection still reaches the old primary
                time.sleep(delay)
                continue
            answer = routing.answer(replies, routes.is_cluster)
            if type(answer) is not Redirect:
                return answer, server
            if answer.kind != "noscript":
                server = routes.redirected(key, server, answer.error, answer.kind)
            if answer.delay:
                time.sleep(answer.delay)

    def _replicas_on(self, server: Server, request: Request) -> Request:
        """``request`` as it goes to ``server``: a script call whose replicas are
        ``"auto"`` waits for as many as the server has (read when due)."""
        if not wants_reading(request):
            return request
        assert isinstance(request, Call)
        counts = self.backend.replica_counts
        if counts.due(server.name):
            counts.learn(server.name, server.request([READ_REPLICAS])[0])
        return resolved(request, counts.required(server.name))

    # -- pipelines ----------------------------------------------------------------------

    def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Run ``calls`` pipelined, one round trip per server, giving up after ``within``
        seconds whatever the client's socket timeout (used where an answer is useless past
        a deadline: renewals). Returns one result per call, a :class:`LockError` in place
        of a refused one; raises ``LockBackendUnavailable`` when no answer came in time
        (the connection is then closed, so the next attempt runs on a fresh one)."""
        deadline = time.monotonic() + max(within, 0.001)
        results: list[Any] = [None] * len(calls)
        try:
            routes = self.backend.routes()
            for server, indexes in by_server(routes, calls).items():
                replies = self._scripts_on(server, [calls[i] for i in indexes], deadline)
                for i, reply in zip(indexes, replies, strict=True):
                    if isinstance(reply, AskError | TryAgainError):  # a slot migrates
                        reply = self._routed(calls[i].keys[0], calls[i])[0]
                    results[i] = (
                        failure(self.name, reply) if isinstance(reply, BaseException) else reply
                    )
        except NotSent as failed:
            raise unavailable(self.name, failed.error) from failed
        except BACKEND_ERRORS as exc:
            raise unavailable(self.name, exc) from exc
        return results

    def _scripts_on(self, server: Server, calls: list[Call], deadline: float) -> list[Any]:
        commands = [commands_for(call, by_sha=True, asking=False)[0] for call in calls]
        replies = server.bounded_request(commands, deadline)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            commands = [commands_for(calls[i], by_sha=False, asking=False)[0] for i in missing]
            loaded = server.bounded_request(commands, deadline)
            for i, reply in zip(missing, loaded, strict=True):
                replies[i] = reply
        return replies

    def pipeline(self, server: Server, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run plain ``commands`` pipelined on ``server``; an error reply takes the place
        of its result."""
        try:
            return server.request(commands)
        except NotSent as failed:
            raise unavailable(self.name, failed.error) from failed
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    # -- steps --------------------------------------------------------------------------

    def run(self, steps: Generator[Op, Any, T]) -> T:
        """Carry out ``steps`` and return their result. Any exception met on the way,
        ``KeyboardInterrupt`` included, is thrown into the steps so they can clean up."""
        try:
            self.backend.routes().prepare()
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        result: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    op = steps.throw(error) if error is not None else steps.send(result)
                except StopIteration as stop:
                    return stop.value
                if result is Wake.WOKEN and error is None:
                    self._woken_unseen = False  # the steps know
                error = None
                try:
                    result = self._do(op)
                except BaseException as exc:  # noqa: BLE001 - handed to the steps
                    error = exc
        finally:
            self._drop_wait()

    def _do(self, op: Op) -> Any:
        if type(op) is Call:
            return self.call(op)
        try:
            if isinstance(op, StartWait):
                return self._start_wait(op)
            if isinstance(op, AwaitWakeUp):
                return self._await_wait(op)
            if isinstance(op, CallEndingWait):
                return self._call_ending_wait(op)
            if isinstance(op, Pause):
                time.sleep(op.seconds)
                return None
        except NotSent as failed:
            self._drop_wait()
            raise unavailable(self.name, failed.error) from failed
        except BACKEND_ERRORS as exc:
            self._drop_wait()
            raise failure(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    def _start_wait(self, op: StartWait) -> None:
        self._wait_keys = op.keys
        self._open_wait(self.backend.routes().for_key(op.keys[0]), self._blpop())

    def _blpop(self) -> Routing:
        """The blocking wait on the keys of the wait at hand, as a request to route. While
        a migration splits its slot, a ``BLPOP`` of two lists (that exist only while they
        hold a wake-up) is refused ``TRYAGAIN`` until the move ends: the wait's deadline
        bounds that, not :data:`~.requests.TRYAGAIN_BUDGET` (the steps then re-check)."""
        return Routing(("BLPOP", *self._wait_keys, self.backend.tuning.server_wait), math.inf)

    def _open_wait(self, server: Server, routing: Routing) -> None:
        connection = server.open_wait()
        self._wait, self._woken_unseen = (server, connection), False
        try:
            connection.send_packed_command(connection.pack_commands(routing.commands()))
            if routing.asking:
                connection.read_response()  # ASKING's OK
        except BaseException:
            self._drop_wait()
            raise

    def _await_wait(self, op: AwaitWakeUp) -> Wake:
        deadline = time.monotonic() + op.timeout
        routing = self._blpop()  # what ends the wait is ridden out like any refusal
        while True:
            assert self._wait is not None
            server, connection = self._wait
            if not connection.can_read(timeout=max(deadline - time.monotonic(), 0.0)):
                return Wake.TIMER
            try:
                reply = connection.read_response()
            except (ResponseError, ConnectionError) as exc:
                if not (isinstance(exc, ResponseError) or interrupted(exc)):
                    raise
                self._finish_wait()
                routes = self.backend.routes()
                if interrupted(exc):
                    routes.reset_idle()
                    return Wake.INTERRUPTED
                redirect = routing.refused(exc, routes.is_cluster)
                server = routes.redirected(self._wait_keys[0], server, exc, redirect.kind)
                time.sleep(min(redirect.delay, max(deadline - time.monotonic(), 0.0)))
                self._open_wait(server, routing)
                continue
            if woken_by(reply):
                self._woken_unseen = True  # until the steps get WOKEN (run() clears it)
                self._finish_wait()
                return Wake.WOKEN
            # A mark left by an earlier wait, or the server's own timeout: wait on.
            self._finish_wait()
            self._open_wait(server, routing)

    def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        if self._wait is None:
            # The wait already ended with its connection: it may have consumed a wake-up.
            return self.call(op.call), self._woken_unseen
        try:
            reply, server = self._routed(op.call.keys[0], op.call)
        except BaseException:
            self._drop_wait()
            raise
        wait_server, connection = self._wait
        if server is not wait_server:
            self._drop_wait()  # the end mark went to the server the slot moved to
            return reply, True
        try:
            if not connection.can_read(timeout=END_WAIT_REPLY_TIMEOUT):
                raise RedisTimeoutError("the ended wait did not answer")
            answer = connection.read_response()
        except ResponseError:
            self._finish_wait()  # ended by the server (a failover): nothing consumed
            return reply, False
        except BACKEND_ERRORS:
            self._drop_wait()
            return reply, True
        self._finish_wait()
        return reply, woken_by(answer)

    def _finish_wait(self) -> None:
        wait, self._wait = self._wait, None
        if wait is not None:
            wait[0].close_wait(wait[1], clean=True)

    def _drop_wait(self) -> None:
        wait, self._wait = self._wait, None
        if wait is not None:
            self._woken_unseen = True
            wait[0].close_wait(wait[1], clean=False)


def _elsewhere(routes: Routes, key: str, server: Server, error: BaseException) -> Server:
    """The server now holding ``key``, read again after ``server`` could not be reached
    (a failover may have moved it); the connection error itself when nothing changed."""
    if not routes.is_cluster:
        raise error
    routes.refresh()
    moved_to = routes.for_key(key)
    if moved_to is server:
        raise error
    return moved_to


def _refresh(routes: Routes) -> None:
    """After a server failed mid-request, have a cluster read its slot map again (a
    replica may have been promoted); the error at hand is what the caller reports."""
    if routes.is_cluster:
        with contextlib.suppress(BACKEND_ERRORS):
            routes.refresh()


# Longer than a BLPOP's own server timeout, so that the server answers first.
_WAIT_READ_MARGIN = 5.0


class AsyncDriver:
    """Runs steps with redis-py's asyncio connections for the running loop.

    An ``uncancellable`` driver (a release) carries its steps through to the end even if the
    calling task is cancelled meanwhile: they run in a task of their own that the caller
    awaits through cancellations (:func:`completed`); the cancellation stays counted on
    the caller (``Task.cancelling()``) for it to raise once the steps are done.
    """

    __slots__ = (
        "_read",
        "_wait",
        "_wait_keys",
        "_woken_unseen",
        "backend",
        "name",
        "uncancellable",
    )

    def __init__(self, backend: Backend, name: str | None, *, uncancellable: bool = False) -> None:
        self.backend = backend
        self.name = name
        self.uncancellable = uncancellable
        self._wait: tuple[AsyncServer, Any] | None = None
        self._wait_keys: tuple[str, ...] = ()
        self._woken_unseen = False  # see SyncDriver
        self._read: asyncio.Future[Any] | None = None

    # -- single requests --------------------------------------------------------------

    async def call(self, call: Call) -> Any:
        """Async twin of :meth:`SyncDriver.call`."""
        task, requested = cancellations()
        try:
            reply = (await self._routed(call.keys[0], call))[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        keep_cancellation(task, requested)
        return reply

    async def execute(self, key: str, *command: Any) -> Any:
        """Async twin of :meth:`SyncDriver.execute`."""
        task, requested = cancellations()
        try:
            reply = (await self._routed(key, command))[0]
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        keep_cancellation(task, requested)
        return reply

    async def _routed(self, key: str, request: Request) -> tuple[Any, AsyncServer]:
        routes = await self.backend.aroutes()
        server = routes.for_key(key)
        routing = Routing(request)
        while True:
            try:
                routing.request = await self._replicas_on(server, request)
                replies = await server.request(routing.commands())
            except NotSent as failed:
                self.backend.replica_counts.lost(server.name)
                routing.not_sent(failed)
                server = await _aelsewhere(routes, key, server, failed.error)
                continue
            except (ConnectionError, OSError) as exc:
                self.backend.replica_counts.lost(server.name)
                delay = routing.failed(exc)
                if delay is None:
                    await _arefresh(routes)
                    raise
                await routes.reset_idle()  # each idle connection still reaches the old primary
                await asyncio.sleep(delay)
                continue
            answer = routing.answer(replies, routes.is_cluster)
            if type(answer) is not Redirect:
                return answer, server
            if answer.kind != "noscript":
                server = await routes.redirected(key, server, answer.error, answer.kind)
            if answer.delay:
                await asyncio.sleep(answer.delay)

    async def _replicas_on(self, server: AsyncServer, request: Request) -> Request:
        """Async twin of :meth:`SyncDriver._replicas_on`."""
        if not wants_reading(request):
            return request
        assert isinstance(request, Call)
        counts = self.backend.replica_counts
        if counts.due(server.name):
            counts.learn(server.name, (await server.request([READ_REPLICAS]))[0])
        return resolved(request, counts.required(server.name))

    # -- pipelines ----------------------------------------------------------------------

    async def call_many(self, calls: list[Call], within: float) -> list[Any]:
        """Async twin of :meth:`SyncDriver.call_many`."""
        results: list[Any] = [None] * len(calls)
        task, requested = cancellations()
        try:
            async with asyncio.timeout(max(within, 0.001)):
                routes = await self.backend.aroutes()
                for server, indexes in by_server(routes, calls).items():
                    replies = await self._scripts_on(server, [calls[i] for i in indexes])
                    for i, reply in zip(indexes, replies, strict=True):
                        if isinstance(reply, AskError | TryAgainError):
                            reply = (await self._routed(calls[i].keys[0], calls[i]))[0]
                        results[i] = (
                            failure(self.name, reply) if isinstance(reply, BaseException) else reply
                        )
        except NotSent as failed:
            raise unavailable(self.name, failed.error) from failed
        except (*BACKEND_ERRORS, TimeoutError) as exc:
            raise unavailable(self.name, exc) from exc
        keep_cancellation(task, requested)
        return results

    async def _scripts_on(self, server: AsyncServer, calls: list[Call]) -> list[Any]:
        commands = [commands_for(call, by_sha=True, asking=False)[0] for call in calls]
        replies = await server.bounded_request(commands)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            commands = [commands_for(calls[i], by_sha=False, asking=False)[0] for i in missing]
            loaded = await server.bounded_request(commands)
            for i, reply in zip(missing, loaded, strict=True):
                replies[i] = reply
        return replies

    async def pipeline(self, server: AsyncServer, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Async twin of :meth:`SyncDriver.pipeline`."""
        try:
            return await server.request(commands)
        except NotSent as failed:
            raise unavailable(self.name, failed.error) from failed
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc

    # -- steps --------------------------------------------------------------------------

    async def run(self, steps: Generator[Op, Any, T]) -> T:
        """Carry out ``steps``. A cancellation is thrown into the steps; the clean-up
        steps they then ask for run to completion, and the task stays cancelled. A
        uncancellable driver runs them to the end whatever happens to the caller."""
        if self.uncancellable:
            return (await completed(self._run(steps)))[0]
        return await self._run(steps)

    async def _run(self, steps: Generator[Op, Any, T]) -> T:
        # Counted before anything is awaited: a cancellation the client loses while the
        # routes are read (a cluster's slot map) is this run's, not an older one.
        task, requested = cancellations()
        try:  # where keys live is read before the steps: no request's time includes it
            await self.backend.aroutes()
        except BACKEND_ERRORS as exc:
            raise failure(self.name, exc) from exc
        keep_cancellation(task, requested)
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
                    result = stop.value
                    break
                if result is Wake.WOKEN and error is None:
                    self._woken_unseen = False  # the steps know
                error = None
                try:
                    if cancelled:
                        result, _ = await completed(self._do(op))
                    else:
                        result = await self._do(op)
                        keep_cancellation(task, requested)
                except BaseException as exc:  # noqa: BLE001 - handed to the steps
                    cancelled = cancelled or isinstance(exc, asyncio.CancelledError)
                    error = exc
        finally:
            self._drop_wait()  # a wait finished steps left open
        return result

    async def _do(self, op: Op) -> Any:
        if type(op) is Call:
            try:
                return (await self._routed(op.keys[0], op))[0]
            except BACKEND_ERRORS as exc:
                raise failure(self.name, exc) from exc
        try:
            if isinstance(op, StartWait):
                return await self._start_wait(op)
            if isinstance(op, AwaitWakeUp):
                return await self._await_wait(op)
            if isinstance(op, CallEndingWait):
                return await self._call_ending_wait(op)
            if isinstance(op, Pause):
                return await asyncio.sleep(op.seconds)
        except NotSent as failed:
            self._drop_wait()
            raise unavailable(self.name, failed.error) from failed
        except BACKEND_ERRORS as exc:
            self._drop_wait()
            raise failure(self.name, exc) from exc
        raise TypeError(f"unknown step {op!r}")  # pragma: no cover

    async def _start_wait(self, op: StartWait) -> None:
        self._wait_keys = op.keys
        routes = await self.backend.aroutes()
        await self._open_wait(routes.for_key(op.keys[0]), self._blpop())

    def _blpop(self) -> Routing:
        """Twin of :meth:`SyncDriver._blpop`."""
        return Routing(("BLPOP", *self._wait_keys, self.backend.tuning.server_wait), math.inf)

    async def _open_wait(self, server: AsyncServer, routing: Routing) -> None:
        connection = await server.open_wait()
        self._wait, self._woken_unseen = (server, connection), False
        try:
            await asend(connection, routing.commands())
            if routing.asking:
                await connection.read_response()  # ASKING's OK
        except BaseException:
            self._drop_wait()
            raise
        # Read in a task of its own: waiting for it may time out or be cancelled without
        # cutting a reply in half.
        self._read = asyncio.ensure_future(
            connection.read_response(timeout=self.backend.tuning.server_wait + _WAIT_READ_MARGIN)
        )

    async def _await_wait(self, op: AwaitWakeUp) -> Wake:
        deadline = time.monotonic() + op.timeout
        routing = self._blpop()
        task, requested = cancellations()
        while True:
            keep_cancellation(task, requested)  # lost as the wait was sent again
            read = self._read
            assert read is not None
            assert self._wait is not None
            done, _ = await asyncio.wait({read}, timeout=max(deadline - time.monotonic(), 0.0))
            if not done:
                return Wake.TIMER
            server = self._wait[0]
            try:
                reply = read.result()
            except (ResponseError, ConnectionError) as exc:
                if not (isinstance(exc, ResponseError) or interrupted(exc)):
                    raise
                await self._finish_wait()
                routes = await self.backend.aroutes()
                if interrupted(exc):
                    await routes.reset_idle()
                    return Wake.INTERRUPTED
                redirect = routing.refused(exc, routes.is_cluster)
                server = await routes.redirected(self._wait_keys[0], server, exc, redirect.kind)
                await asyncio.sleep(min(redirect.delay, max(deadline - time.monotonic(), 0.0)))
                await self._open_wait(server, routing)
                continue
            if woken_by(reply):
                self._woken_unseen = True  # until the steps get WOKEN (run() clears it)
                await self._finish_wait()
                return Wake.WOKEN
            await self._finish_wait()  # a leftover end mark, or the server's own timeout
            await self._open_wait(server, routing)

    async def _call_ending_wait(self, op: CallEndingWait) -> tuple[Any, bool]:
        read = self._read
        if self._wait is None or read is None:
            return await self.call(op.call), self._woken_unseen
        try:
            reply, server = await self._routed(op.call.keys[0], op.call)
        except BaseException as exc:
            self._drop_wait()
            if isinstance(exc, BACKEND_ERRORS):
                raise failure(self.name, exc) from exc
            raise
        if server is not self._wait[0]:
            self._drop_wait()
            return reply, True
        done, _ = await asyncio.wait({read}, timeout=END_WAIT_REPLY_TIMEOUT)
        if not done:
            self._drop_wait()
            return reply, True
        try:
            answer = read.result()
        except ResponseError:
            await self._finish_wait()  # ended by the server (a failover): nothing consumed
            return reply, False
        except BACKEND_ERRORS:
            self._drop_wait()
            return reply, True
        await self._finish_wait()
        return reply, woken_by(answer)

    async def _finish_wait(self) -> None:
        wait, self._wait, self._read = self._wait, None, None
        if wait is not None:
            await wait[0].close_wait(wait[1], clean=True)

    def _drop_wait(self) -> None:
        """Let go of the outstanding wait; its connection is disconnected and closed in the
        background. Never awaited: a cancellation arriving during an awaited close would
        interrupt it, or have nowhere to go once the steps are done."""
        wait, read = self._wait, self._read
        self._wait = self._read = None
        if wait is None:
            return
        self._woken_unseen = True
        server, connection = wait
        if read is None or read.done():
            _spawn(server.close_wait(connection, clean=False))
            return
        # The reader may still touch the connection: it goes back once the reader is done.
        read.cancel()
        read.add_done_callback(lambda _: _spawn(server.close_wait(connection, clean=False)))


_spawned: set[asyncio.Task[Any]] = set()


def _spawn(coroutine: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(coroutine)
    _spawned.add(task)
    task.add_done_callback(_spawned.discard)


async def _aelsewhere(
    routes: AsyncRoutes, key: str, server: AsyncServer, error: BaseException
) -> AsyncServer:
    """Async twin of :func:`_elsewhere`."""
    if not routes.is_cluster:
        raise error
    await routes.refresh()
    moved_to = routes.for_key(key)
    if moved_to is server:
        raise error
    return moved_to


async def _arefresh(routes: AsyncRoutes) -> None:
    """Async twin of :func:`_refresh`."""
    if routes.is_cluster:
        with contextlib.suppress(BACKEND_ERRORS):
            await routes.refresh()
