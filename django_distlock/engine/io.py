"""The sync I/O shell: carries out the steps of :mod:`.core` with redis-py's sync
connections, on the server that holds each key (:mod:`.servers`). Everything it knows
about locks is in the steps it is given; what every request shares (replies kept with
their request, redirects, errors) is in :mod:`.requests`. :mod:`.aio` is its async twin.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import AskError, ConnectionError, NoScriptError, ResponseError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .ops import AwaitWakeUp, Call, CallEndingWait, Op, Pause, StartWait, Wake
from .replication import READ_REPLICAS, resolved, wants_reading
from .requests import (
    BACKEND_ERRORS,
    NotSent,
    Redirect,
    Request,
    Routing,
    asking_after,
    by_server,
    commands_for,
    failure,
    interrupted,
    redirect_of,
    unavailable,
    woken_by,
)

if TYPE_CHECKING:
    from .backend import Backend
    from .servers import Routes, Server

__all__ = ["END_WAIT_REPLY_TIMEOUT", "SyncDriver"]

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
        connection (:class:`~.ops.Replicated`)."""
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
        within = self.backend.tuning.renewal_attempt
        replies = server.bounded_request(commands, deadline, within)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            commands = [commands_for(calls[i], by_sha=False, asking=False)[0] for i in missing]
            loaded = server.bounded_request(commands, deadline, within)
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
        self._open_wait(self.backend.routes().for_key(op.keys[0]), op.keys, asking=False)

    def _open_wait(self, server: Server, keys: tuple[str, ...], *, asking: bool) -> None:
        connection = server.open_wait()
        self._wait, self._wait_keys, self._woken_unseen = (server, connection), keys, False
        blpop = ("BLPOP", *keys, self.backend.tuning.server_wait)
        try:
            if asking:
                connection.send_packed_command(connection.pack_commands([("ASKING",), blpop]))
                connection.read_response()
            else:
                connection.send_command(*blpop)
        except BaseException:
            self._drop_wait()
            raise

    def _await_wait(self, op: AwaitWakeUp) -> Wake:
        started = time.monotonic()
        deadline = started + op.timeout
        redirects = 0
        asking = False
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
                keys = self._wait_keys
                self._finish_wait()
                routes = self.backend.routes()
                if interrupted(exc):
                    routes.reset_idle()
                    return Wake.INTERRUPTED
                redirect = redirect_of(routes.is_cluster, exc, redirects, started)
                if redirect is None:
                    raise
                kind, delay = redirect
                server = routes.redirected(keys[0], server, exc, kind)
                time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
                asking = asking_after(kind, asking)
                self._open_wait(server, keys, asking=asking)
                if kind != "again":
                    redirects += 1
                continue
            if woken_by(reply):
                self._woken_unseen = True  # until the steps get WOKEN (run() clears it)
                self._finish_wait()
                return Wake.WOKEN
            # A mark left by an earlier wait, or the server's own timeout: wait on.
            self._finish_wait()
            self._open_wait(server, self._wait_keys, asking=asking)

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
