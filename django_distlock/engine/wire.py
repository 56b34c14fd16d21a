"""The async driver's short way to the socket: one request written to the connection's
stream and its reply parsed from it, without redis-py's layers around them.

Even without socket timeouts (the engine's pools bound requests themselves), redis-py's
asyncio connection costs about 8 µs per request on one CPU above writing to and reading
from its own ``StreamReader``/``StreamWriter`` (its write and read are coroutines in
coroutines, with a parser object, a replay buffer for cancelled reads and timeout
bookkeeping): 10 µs of a 150 µs uncontended acquire+release cycle on one CPU, about 20
µs of 440 with client and server on separate CPUs (where the code runs cold). The async
driver therefore writes and reads a connection directly when it can say for sure that
redis-py would do exactly the same:

- the connection is connected, with redis-py's pure-Python RESP2 or RESP3 parser (not
  hiredis, which buffers bytes of its own) and nothing left in that parser's replay
  buffer, so the stream is at the start of the next reply;
- the connection's class writes and reads as redis-py's own (not a subclass with a
  ``send_packed_command`` or ``read_response`` of its own, like Sentinel's);
- no health checks are configured (redis-py makes them inside its write); RESP3 push
  messages (maintenance notifications of managed services, for one) go to the parser's
  own handler, as redis-py's read sends them;
- nothing is lost to a cancellation: the stream's reads consume nothing when they are
  cancelled, so a request that must be carried through (a release) simply reads on,
  and any other cancelled request closes its connection (as every failure does).

Otherwise, or with a redis-py whose private names differ (:data:`SUPPORTED` says so),
the driver goes through redis-py as before. Replies are parsed as redis-py's parsers
parse them: the same Python values, the same exception classes for error replies, and
``ConnectionError`` for a closed or failed socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError, InvalidResponse, ResponseError

try:
    from redis._parsers import _AsyncRESP2Parser, _AsyncRESP3Parser
except ImportError:  # pragma: no cover - a redis-py without them: always through redis-py
    _PARSERS: tuple[type, ...] = ()
else:
    _PARSERS = (_AsyncRESP2Parser, _AsyncRESP3Parser)

__all__ = ["SUPPORTED", "carried", "direct", "read_reply", "write"]

_CLOSED = "Connection closed by server."

T = TypeVar("T")
KeepOn = Callable[[], bool] | None


def _supported() -> bool:
    """Whether this redis-py's connections and parsers keep what :func:`direct` looks at
    under the names it uses (they are private)."""
    try:
        from redis.asyncio import Connection

        connection = Connection()
        parsers = [parser(65536) for parser in _PARSERS]
        return (
            bool(parsers)
            and all(hasattr(parser, "_buffer") and hasattr(parser, "_chunks") for parser in parsers)
            and all(hasattr(parser, "parse_error") for parser in parsers)
            and hasattr(parsers[-1], "handle_push_response")  # RESP3's: pushes are RESP3
            and all(
                hasattr(connection, name)
                for name in ("_parser", "_reader", "_writer", "encoder", "health_check_interval")
            )
        )
    except Exception:  # noqa: BLE001 - any surprise means: not supported
        return False


SUPPORTED = _supported()
"""True when this redis-py lets the async driver write and read its connections
directly (see the module's docstring)."""

_DIRECT_PARSERS = _PARSERS if SUPPORTED else ()


try:
    from redis.asyncio.connection import AbstractConnection

    _SEND: Any = AbstractConnection.send_packed_command
    _READ: Any = AbstractConnection.read_response
except (ImportError, AttributeError):  # pragma: no cover
    _SEND = _READ = None


def direct(connection: Any) -> bool:
    """Whether a request on ``connection`` may be written and read directly now."""
    cls = type(connection)
    # A connection class that writes or reads its own way (Sentinel's checks the replies
    # of a failed-over primary; tests inject faults) is left to do so.
    if cls.send_packed_command is not _SEND or cls.read_response is not _READ:
        return False
    parser = connection._parser
    return (
        type(parser) in _DIRECT_PARSERS
        and not parser._chunks
        and not parser._buffer
        and connection._writer is not None
        and not connection.health_check_interval
    )


def write(connection: Any, data: bytes, keep_on: KeepOn = None) -> Awaitable[None] | None:
    """Write ``data`` (packed commands) to ``connection``; what to await when the
    transport holds part of it back (flow control), else ``None``.

    ``keep_on`` is for a request that must be carried through to its answer across
    cancellations (a release): a cancellation of the wait for the transport, or of
    :func:`read_reply` given the same ``keep_on``, is ignored while ``keep_on()`` is
    true. Nothing is lost meanwhile: written data stays written, and a cancelled read
    of the stream consumed nothing."""
    writer = connection._writer
    writer.write(data)
    if writer.transport.get_write_buffer_size():
        return _drained(writer, keep_on)
    return None


async def _drained(writer: Any, keep_on: KeepOn) -> None:
    try:
        await carried(writer.drain, (), keep_on)
    except OSError as exc:
        raise ConnectionError(f"Error while writing to socket: {exc.args}.") from exc


async def read_reply(connection: Any, keep_on: KeepOn = None) -> Any:
    """The next reply on ``connection``, as ``connection.read_response()`` returns it:
    an error reply is raised (as redis-py's exception class for it). With ``keep_on``,
    a cancellation is ignored for as long as ``keep_on()`` says so (see :func:`write`)."""
    try:
        reply = await _read(connection._reader, connection, keep_on)
    except OSError as exc:
        raise ConnectionError(
            f"Error while reading from {_where(connection)} : {exc.args}"
        ) from exc
    if isinstance(reply, ResponseError):
        raise reply from None
    return reply


def _where(connection: Any) -> str:
    try:
        return str(connection._host_error())
    except Exception:  # noqa: BLE001 - only for the message
        return repr(connection)


async def carried(start: Callable[..., Awaitable[T]], args: tuple[Any, ...], keep_on: KeepOn) -> T:
    """``await start(*args)``, started again after a cancellation while ``keep_on()``
    (not at all when ``keep_on`` is None), for operations that lose nothing when they are
    cancelled: the stream's reads (a cancelled one consumed nothing), redis-py's read (it
    keeps what it had read for the next), anything that sent nothing yet."""
    while True:
        try:
            return await start(*args)
        except asyncio.CancelledError:
            if keep_on is None or not keep_on():
                raise


async def _read(reader: Any, connection: Any, keep_on: KeepOn) -> Any:
    if keep_on is None:
        line = await reader.readline()
    else:
        line = await carried(reader.readline, (), keep_on)
    if line[-2:] != b"\r\n":
        raise ConnectionError(_CLOSED)
    kind = line[0]
    if kind == 58 or kind == 40:  # ':' integer, '(' big number
        return int(line[1:-2])
    if kind == 36:  # '$' bulk string
        size = int(line[1:-2])
        if size < 0:
            return None
        return _decoded(connection, (await _exactly(reader, size + 2, keep_on))[:-2])
    if kind == 42:  # '*' array
        size = int(line[1:-2])
        if size < 0:
            return None
        return [await _read(reader, connection, keep_on) for _ in range(size)]
    if kind == 43:  # '+' simple string
        return _decoded(connection, line[1:-2])
    if kind == 45 or kind == 33:  # '-' error, '!' bulk error
        text = line[1:-2]
        if kind == 33:
            text = (await _exactly(reader, int(text) + 2, keep_on))[:-2]
        error = connection._parser.parse_error(text.decode("utf-8", errors="replace"))
        if isinstance(error, ConnectionError):
            raise error
        return error  # raised by read_reply; an element of an array otherwise
    if kind == 95:  # '_' null
        return None
    if kind == 44:  # ',' double
        return float(line[1:-2])
    if kind == 35:  # '#' boolean
        return line[1:-2] == b"t"
    if kind == 61:  # '=' verbatim string: a 3-letter format and ':' first
        text = await _exactly(reader, int(line[1:-2]) + 2, keep_on)
        return _decoded(connection, text[4:-2])
    if kind == 126:  # '~' set, as a list like redis-py
        return [await _read(reader, connection, keep_on) for _ in range(int(line[1:-2]))]
    if kind == 37:  # '%' map
        pairs = {}
        for _ in range(int(line[1:-2])):
            key = await _read(reader, connection, keep_on)
            pairs[key] = await _read(reader, connection, keep_on)
        return pairs
    if kind == 62:  # '>' push: handed to redis-py's handler, then the reply itself
        push = [await _read(reader, connection, keep_on) for _ in range(int(line[1:-2]))]
        await connection._parser.handle_push_response(push)
        return await _read(reader, connection, keep_on)
    raise InvalidResponse(f"Protocol Error: {line!r}")


async def _exactly(reader: Any, size: int, keep_on: KeepOn) -> bytes:
    try:
        data: bytes = await carried(reader.readexactly, (size,), keep_on)
    except asyncio.IncompleteReadError as exc:
        raise ConnectionError(_CLOSED) from exc
    return data


def _decoded(connection: Any, value: bytes) -> Any:
    encoder = connection.encoder
    if encoder.decode_responses:
        return encoder.decode(value)
    return value
