"""A TCP proxy that fault tests put between a client and a Redis server, to stall, cut
or delay the traffic of live connections on command.

One thread runs a ``selectors`` loop for the listening socket and every proxied
connection; the control methods hand it a command and return once the loop carried it
out, so a test that called :meth:`TcpProxy.stall` knows no byte is forwarded after it.

Example::

    with TcpProxy("127.0.0.1", server.port) as proxy:
        client = redis.Redis(port=proxy.port)
        client.ping()
        proxy.stall()          # the next command gets no answer until resume()
        proxy.resume()
        proxy.delay_client_data(sends_command("BLPOP"), 0.05)

Django-free on purpose.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["ChunkPredicate", "ProxyError", "TcpProxy", "sends_command"]

HOST = "127.0.0.1"

ChunkPredicate = Callable[[bytes], bool]

_CHUNK = 256 * 1024
# Stop reading from one side while this much waits to be written to the other, so a
# stalled or slow reader pushes back on the writer instead of filling our memory.
_HIGH_WATER = 4 * 1024 * 1024
_COMMAND_TIMEOUT = 10.0
_JOIN_TIMEOUT = 10.0


class ProxyError(RuntimeError):
    """The proxy is closed, or its thread did not carry out a command in time."""


def sends_command(name: str) -> ChunkPredicate:
    """A predicate for :meth:`TcpProxy.delay_client_data`: true for chunks that carry
    the Redis command ``name`` (as redis-py spells it, e.g. ``"BLPOP"``).

    Matches the RESP bulk string ``$5\\r\\nBLPOP\\r\\n`` rather than the bare word, so a
    script or a value that merely mentions the command does not match.
    """
    encoded = name.encode()
    marker = b"$%d\r\n%s\r\n" % (len(encoded), encoded)
    return lambda chunk: marker in chunk


class _Link:
    """One proxied connection: the client's socket, ours to the server, and the bytes
    in transit between them."""

    __slots__ = (
        "client",
        "client_eof",
        "connected",
        "held",
        "lose_reply",
        "server",
        "server_eof",
        "stalled",
        "to_client",
        "to_server",
    )

    def __init__(self, client: socket.socket, server: socket.socket, *, stalled: bool) -> None:
        self.client = client
        self.server = server
        self.to_server = bytearray()
        self.to_client = bytearray()
        # Client chunks held back by a delay rule, with the monotonic time each may go;
        # a chunk never overtakes one held before it, delayed or not.
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()
        self.connected = False
        self.stalled = stalled
        self.client_eof = False
        self.server_eof = False
        # Set by a lose_reply rule: what the server answers next is dropped and the link
        # cut, so the request ran but its reply never reaches the client.
        self.lose_reply = False

    def held_bytes(self) -> int:
        return sum(len(chunk) for _, chunk in self.held)


class TcpProxy:
    """Forwards TCP connections from a free loopback port to ``target_host:target_port``.

    Controls (callable from any thread; each returns once it is in effect):

    * :meth:`stall` stops forwarding in both directions on every connection, and on
      connections accepted later, keeping all sockets open; :meth:`resume` undoes it;
    * :meth:`stall_existing` stalls only the connections open now;
    * :meth:`cut` closes every current connection abruptly (RST to both ends);
    * :meth:`delay_client_data` holds back client-to-server chunks matching a predicate;
    * :meth:`lose_reply` lets the next request matching a predicate reach the server and
      cuts its connection when the reply comes, dropping the reply.

    A stalled connection reads nothing, so its peers see a silent but open socket, as
    with a server paused by SIGSTOP or a network partition. Use as a context manager, or
    call :meth:`close`: it stops the thread and closes every socket.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(1024)
        self._listener.setblocking(False)
        self._port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, self._run_commands)
        self._interest: dict[socket.socket, int] = {}
        self._links: set[_Link] = set()
        self._holding: set[_Link] = set()
        self._stall_new = False
        self._delays: list[tuple[ChunkPredicate, float]] = []
        self._lose_replies: list[ChunkPredicate] = []
        self._replies_lost = 0
        self._commands: collections.deque[tuple[Callable[[], None], threading.Event]] = (
            collections.deque()
        )
        self._stopping = False
        self._closed = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._loop, name=f"tcp-proxy-{self._port}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"<TcpProxy :{self._port} -> {self.target[0]}:{self.target[1]}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The loopback port clients connect to."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` for the proxy's port."""
        return f"redis://{HOST}:{self._port}/0"

    @property
    def connection_count(self) -> int:
        """Connections open through the proxy right now."""
        return len(self._links)

    # -- controls -------------------------------------------------------------------

    def point_at(self, host: str, port: int) -> None:
        """Open new connections to ``host:port`` from now on (a virtual IP moved by a
        failover); open ones stay where they are until :meth:`cut`."""
        self.target = (host, port)

    def stall(self) -> None:
        """Stop forwarding in both directions on all connections, current and new."""

        def command() -> None:
            self._stall_new = True
            for link in self._links:
                link.stalled = True
                self._update(link)

        self._call(command)

    def stall_existing(self) -> None:
        """Stall the connections open now; connections accepted later forward normally."""

        def command() -> None:
            for link in self._links:
                link.stalled = True
                self._update(link)

        self._call(command)

    def resume(self) -> None:
        """Forward again on every connection (what was held back is sent in order)."""

        def command() -> None:
            self._stall_new = False
            for link in list(self._links):
                link.stalled = False
                self._release_held(link, time.monotonic())
                self._update(link)

        self._call(command)

    def cut(self) -> None:
        """Close every current connection abruptly: both ends get a reset."""

        def command() -> None:
            for link in list(self._links):
                self._close_link(link, abort=True)

        self._call(command)

    def delay_client_data(self, predicate: ChunkPredicate, seconds: float) -> None:
        """From now on, hold each client-to-server chunk for which ``predicate(chunk)`` is
        true for ``seconds`` before forwarding it. Later chunks of the same connection
        wait behind it, so the order on each connection is kept. A chunk is what one
        ``recv`` returned: usually one command, or one pipeline. Rules add up (the
        longest matching delay applies); :meth:`clear_delays` removes them."""
        if seconds < 0:
            raise ValueError(f"seconds must be zero or positive, not {seconds!r}")

        def command() -> None:
            self._delays.append((predicate, seconds))

        self._call(command)

    def clear_delays(self) -> None:
        """Stop delaying new chunks (chunks already held still wait their time)."""
        self._call(self._delays.clear)

    def lose_reply(self, predicate: ChunkPredicate) -> None:
        """Lose the reply to the next client-to-server chunk for which ``predicate(chunk)``
        is true (once): the chunk is forwarded, and when the server's answer arrives on
        that connection it is dropped and the connection cut (a reset to both ends), as
        when a network fails after the request got through. The server has run the
        request by then. Other connections, and connections made later, work as before.
        :attr:`replies_lost` counts the replies lost so far."""

        def command() -> None:
            self._lose_replies.append(predicate)

        self._call(command)

    @property
    def replies_lost(self) -> int:
        """How many replies :meth:`lose_reply` rules dropped so far."""
        return self._replies_lost

    def close(self) -> None:
        """Close every connection and the listening socket, and stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():

            def command() -> None:
                self._stopping = True

            self._commands.append((command, threading.Event()))
            self._wake()
            self._thread.join(_JOIN_TIMEOUT)
        if self._thread.is_alive():
            raise ProxyError(f"{self!r}: its thread did not stop within {_JOIN_TIMEOUT}s")
        for link in list(self._links):
            self._close_link(link, abort=True)
        self._selector.close()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()

    def _call(self, command: Callable[[], None]) -> None:
        if self._closed or not self._thread.is_alive():
            raise ProxyError(f"{self!r} is closed") from self._failure
        done = threading.Event()
        self._commands.append((command, done))
        self._wake()
        if not done.wait(_COMMAND_TIMEOUT):
            raise ProxyError(f"{self!r}: command not carried out within {_COMMAND_TIMEOUT}s")

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the loop has wake-ups pending already
            self._wake_writer.send(b"\0")

    # -- the loop (runs in the proxy thread only) -----------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._selector.select(self._select_timeout()):
                    key.data(key.fileobj, mask)
                if self._holding:
                    now = time.monotonic()
                    for link in list(self._holding):
                        self._release_held(link, now)
                        self._update(link)
        except BaseException as exc:  # reported by the next control call
            self._failure = exc
            raise

    def _select_timeout(self) -> float | None:
        releases = [link.held[0][0] for link in self._holding if not link.stalled]
        if not releases:
            return None
        return max(0.0, min(releases) - time.monotonic())

    def _run_commands(self, sock: socket.socket, mask: int) -> None:
        try:
            while sock.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._commands:
            command, done = self._commands.popleft()
            try:
                command()
            finally:
                done.set()

    def _accept(self, sock: socket.socket, mask: int) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            for end in (client, server):
                end.setblocking(False)
                end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = server.connect_ex(self.target)
            if code not in (0, errno.EINPROGRESS):
                _abort(client)
                server.close()
                continue
            link = _Link(client, server, stalled=self._stall_new)
            link.connected = code == 0
            self._links.add(link)
            self._update(link)

    def _update(self, link: _Link) -> None:
        """Register the events each socket of ``link`` needs in its current state."""
        if link not in self._links:
            return
        client_events = server_events = 0
        if not link.connected:
            server_events = selectors.EVENT_WRITE  # tells when the connect completed
        elif not link.stalled:
            if not link.client_eof and len(link.to_server) + link.held_bytes() < _HIGH_WATER:
                client_events |= selectors.EVENT_READ
            if link.to_client:
                client_events |= selectors.EVENT_WRITE
            if not link.server_eof and len(link.to_client) < _HIGH_WATER:
                server_events |= selectors.EVENT_READ
            if link.to_server:
                server_events |= selectors.EVENT_WRITE
        self._register(link.client, client_events, link)
        self._register(link.server, server_events, link)

    def _register(self, sock: socket.socket, events: int, link: _Link) -> None:
        current = self._interest.get(sock, 0)
        if events == current:
            return
        handler = self._on_client if sock is link.client else self._on_server
        if current == 0:
            self._selector.register(sock, events, _bind(handler, link))
        elif events == 0:
            self._selector.unregister(sock)
        else:
            self._selector.modify(sock, events, _bind(handler, link))
        if events:
            self._interest[sock] = events
        else:
            self._interest.pop(sock, None)

    def _on_client(self, link: _Link, mask: int) -> None:
        if link not in self._links:
            return  # closed by an earlier event of the same batch
        try:
            if mask & selectors.EVENT_WRITE and link.to_client:
                _send(link.client, link.to_client)
            if mask & selectors.EVENT_READ:
                data = link.client.recv(_CHUNK)
                if data:
                    self._from_client(link, data)
                    if link.to_server and link.connected:
                        _send(link.server, link.to_server)  # at once: saves a select
                else:
                    link.client_eof = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close_link(link, abort=True)
            return
        self._settle(link)

    def _on_server(self, link: _Link, mask: int) -> None:
        if link not in self._links:
            return
        try:
            if not link.connected:
                code = link.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    self._close_link(link, abort=True)
                    return
                link.connected = True
            else:
                if mask & selectors.EVENT_WRITE and link.to_server:
                    _send(link.server, link.to_server)
                if mask & selectors.EVENT_READ:
                    data = link.server.recv(_CHUNK)
                    if data and link.lose_reply:
                        self._replies_lost += 1
                        self._close_link(link, abort=True)
                        return
                    if data:
                        link.to_client += data
                        _send(link.client, link.to_client)
                    else:
                        link.server_eof = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close_link(link, abort=True)
            return
        self._settle(link)

    def _from_client(self, link: _Link, data: bytes) -> None:
        for rule in self._lose_replies:
            if rule(data):
                self._lose_replies.remove(rule)
                link.lose_reply = True
                break
        delay = max((seconds for match, seconds in self._delays if match(data)), default=0.0)
        if delay > 0 or link.held:
            link.held.append((time.monotonic() + delay, data))
            self._holding.add(link)
        else:
            link.to_server += data

    def _release_held(self, link: _Link, now: float) -> None:
        if link.stalled:
            return
        while link.held and link.held[0][0] <= now:
            link.to_server += link.held.popleft()[1]
        if not link.held:
            self._holding.discard(link)

    def _settle(self, link: _Link) -> None:
        """Close ``link`` once one side hung up and what it sent has been passed on."""
        if link not in self._links:
            return
        client_done = link.client_eof and not link.to_server and not link.held
        server_done = link.server_eof and not link.to_client
        if client_done or server_done:
            self._close_link(link, abort=False)
        else:
            self._update(link)

    def _close_link(self, link: _Link, *, abort: bool) -> None:
        if link not in self._links:
            return
        self._links.discard(link)
        self._holding.discard(link)
        for sock in (link.client, link.server):
            if self._interest.pop(sock, 0):
                self._selector.unregister(sock)
            if abort:
                _abort(sock)
            else:
                sock.close()


def _bind(
    handler: Callable[[_Link, int], None], link: _Link
) -> Callable[[socket.socket, int], None]:
    return lambda sock, mask: handler(link, mask)


def _send(sock: socket.socket, buffer: bytearray) -> None:
    try:
        sent = sock.send(buffer)
    except BlockingIOError:
        return
    del buffer[:sent]


def _abort(sock: socket.socket) -> None:
    """Close with a reset instead of an orderly shutdown (zero linger time)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
