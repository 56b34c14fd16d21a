"""The async driver's direct writes and reads (:mod:`django_distlock.engine.wire`): the
same replies and errors as redis-py's own, nothing lost to cancellations, and chosen only
where redis-py would do the same."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio
from redis._parsers import _AsyncRESP2Parser
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from django_distlock.engine import Backend, Lock, io, wire
from django_distlock.engine.io import pack
from tests.support.engine import HOST, close_backend

# Every RESP2 and RESP3 reply type; RESP3 ones come from a RESP3 connection (maps, sets,
# doubles) or from Lua after redis.setresp(3) (booleans, big numbers).
COMMANDS = [
    ("SET", "w:s", "välue"),
    ("GET", "w:s"),
    ("GET", "w:missing"),
    ("INCR", "w:n"),
    ("DEL", "w:l"),
    ("RPUSH", "w:l", "a", "b"),
    ("LRANGE", "w:l", 0, -1),
    ("LRANGE", "w:missing", 0, -1),
    ("EVAL", "return {1, {2, 'x'}, false, 'y'}", 0),
    ("HSET", "w:h", "f", "v"),
    ("HGETALL", "w:h"),
    ("SADD", "w:set", "m"),
    ("SMEMBERS", "w:set"),
    ("ZADD", "w:z", 1.5, "m"),
    ("ZSCORE", "w:z", "m"),
    ("EVAL", "redis.setresp(3); return true", 0),
    ("EVAL", "redis.setresp(3); return false", 0),
    ("EVAL", "redis.setresp(3); return {big_number='123456789012345678901234567890'}", 0),
    ("EVAL", "redis.setresp(3); return {double=3.5}", 0),
    ("EVAL", "redis.setresp(3); return {map={a=1}}", 0),
    ("EVAL", "redis.setresp(3); return {set={a=true}}", 0),
    ("EVAL", "return {1, redis.error_reply('NOPE in an array')}", 0),
    ("MEMORY", "DOCTOR"),  # a verbatim string in RESP3
    ("PING",),
]


async def connected(port: int, **kwargs) -> redis.asyncio.Connection:
    connection = redis.asyncio.Connection(host=HOST, port=port, **kwargs)
    await connection.connect()
    return connection


@pytest.fixture(params=[(2, False), (2, True), (3, False), (3, True)], ids=str)
async def two_connections(
    request: pytest.FixtureRequest, redis_server
) -> AsyncIterator[tuple[redis.asyncio.Connection, redis.asyncio.Connection]]:
    protocol, decode = request.param
    ours = await connected(redis_server.port, protocol=protocol, decode_responses=decode)
    theirs = await connected(redis_server.port, protocol=protocol, decode_responses=decode)
    yield ours, theirs
    await ours.disconnect()
    await theirs.disconnect()


async def direct_call(connection, *args):
    assert wire.direct(connection)
    sent = wire.write(connection, pack(args))
    if sent is not None:
        await sent
    return await wire.read_reply(connection)


async def redis_py_call(connection, *args):
    await connection.send_packed_command(pack(args), check_health=False)
    return await connection.read_response()


def comparable(reply):
    """Error replies inside arrays are exception instances: compared by class and text."""
    if isinstance(reply, list):
        return [comparable(item) for item in reply]
    if isinstance(reply, Exception):
        return (type(reply), str(reply))
    return reply


def test_this_redis_py_allows_direct_reads():
    # The lock's async fast path depends on it: a redis-py that moved the private names
    # wire.py relies on must be noticed here, not only in the benchmarks.
    assert wire.SUPPORTED


async def test_replies_are_read_as_redis_py_reads_them(two_connections):
    ours, theirs = two_connections
    for side in ("ours", "theirs"):
        await redis_py_call(theirs, "DEL", *(f"w:{side}:{key}" for key in "snlhz"), f"w:{side}:set")
    for command in COMMANDS:
        expected = await redis_py_call(theirs, *on_keys_of("theirs", command))
        got = await direct_call(ours, *on_keys_of("ours", command))
        assert comparable(got) == comparable(expected), command
        assert type(got) is type(expected), command


def on_keys_of(side: str, command: tuple) -> tuple:
    return tuple(
        arg.replace("w:", f"w:{side}:") if isinstance(arg, str) and arg.startswith("w:") else arg
        for arg in command
    )


async def test_error_replies_are_raised_as_redis_py_raises_them(two_connections):
    ours, theirs = two_connections
    await redis_py_call(theirs, "SET", "w:string", "x")
    for command, error in [
        (("EVALSHA", "0" * 40, 0), NoScriptError),
        (("LPUSH", "w:string", "x"), ResponseError),
        (("EVAL", "return redis.error_reply('MOVED 1 127.0.0.1:1')", 0), ResponseError),
        (("NOSUCHCOMMAND",), ResponseError),
    ]:
        with pytest.raises(error) as theirs_raised:
            await redis_py_call(theirs, *command)
        with pytest.raises(error) as ours_raised:
            await direct_call(ours, *command)
        assert type(ours_raised.value) is type(theirs_raised.value)
        assert str(ours_raised.value) == str(theirs_raised.value)
    assert await direct_call(ours, "PING") in (b"PONG", "PONG")  # still in step


async def test_a_push_message_goes_to_the_parsers_handler_before_the_reply(redis_server):
    """RESP3 pushes (client-side caching invalidations here; maintenance notifications of
    managed services) arrive before a reply and are handled as redis-py handles them."""
    other = redis.Redis(host=HOST, port=redis_server.port)
    pushed: dict[str, list] = {"ours": [], "theirs": []}
    connections = {}
    for who in pushed:
        connection = connections[who] = await connected(redis_server.port, protocol=3)

        async def record(push, who=who):
            pushed[who].append(push)

        connection._parser.set_invalidation_push_handler(record)
        await redis_py_call(connection, "CLIENT", "TRACKING", "ON")
        await redis_py_call(connection, "GET", f"w:tracked:{who}")
        other.set(f"w:tracked:{who}", "changed")
    await asyncio.sleep(0.05)  # the invalidations are on their way
    assert await direct_call(connections["ours"], "PING") == b"PONG"
    assert await redis_py_call(connections["theirs"], "PING") == b"PONG"
    assert pushed["ours"] == [[b"invalidate", [b"w:tracked:ours"]]]
    assert pushed["theirs"] == [[b"invalidate", [b"w:tracked:theirs"]]]
    for connection in connections.values():
        await connection.disconnect()
    other.close()


async def test_a_connection_the_server_closed_fails_with_connection_error(redis_server):
    connection = await connected(redis_server.port)
    client_id = await direct_call(connection, "CLIENT", "ID")
    killer = redis.Redis(host=HOST, port=redis_server.port)
    assert killer.client_kill_filter(_id=client_id) == 1
    with pytest.raises(ConnectionError):
        await direct_call(connection, "PING")
    killer.close()
    await connection.disconnect()


async def test_a_request_larger_than_the_socket_buffer_waits_for_the_transport(redis_server):
    connection = await connected(redis_server.port)
    value = b"x" * (32 << 20)
    sent = wire.write(connection, pack(("SET", "w:big", value)))
    assert sent is not None  # the transport holds most of it back
    await sent
    assert await wire.read_reply(connection) == b"OK"
    assert await direct_call(connection, "STRLEN", "w:big") == len(value)
    await direct_call(connection, "DEL", "w:big")
    await connection.disconnect()


@pytest.mark.parametrize("keep_on", [True, False])
async def test_a_read_carried_through_cancellations_loses_nothing(redis_server, keep_on):
    connection = await connected(redis_server.port)
    pusher = redis.Redis(host=HOST, port=redis_server.port)
    pusher.delete("w:queue")
    sent = wire.write(connection, pack(("BLPOP", "w:queue", 5)))
    assert sent is None
    read = asyncio.create_task(wire.read_reply(connection, lambda: keep_on))
    for _ in range(3):
        await asyncio.sleep(0.02)
        read.cancel()
        if not keep_on:
            break
    if keep_on:
        pusher.rpush("w:queue", "item")
        assert await asyncio.wait_for(read, 5) == [b"w:queue", b"item"]
        assert await direct_call(connection, "PING") == b"PONG"  # in step
    else:
        with pytest.raises(asyncio.CancelledError):
            await read
    pusher.close()
    await connection.disconnect()


class OwnReads(redis.asyncio.Connection):
    async def read_response(self, *args, **kwargs):
        return await super().read_response(*args, **kwargs)


class OwnWrites(redis.asyncio.Connection):
    async def send_packed_command(self, *args, **kwargs):
        await super().send_packed_command(*args, **kwargs)


class OtherParser(_AsyncRESP2Parser):
    pass


async def test_direct_io_is_chosen_only_where_redis_py_would_do_the_same(redis_server):
    port = redis_server.port
    plain = await connected(port)
    assert wire.direct(plain)
    plain._parser._chunks.append(b"*2\r\n")  # a cancelled read's bytes, kept for a replay
    assert not wire.direct(plain)
    plain._parser._chunks.clear()
    assert wire.direct(plain)
    await plain.disconnect()
    assert not wire.direct(plain)  # not connected: redis-py reconnects
    for connection in [
        await connected(port, health_check_interval=30),
        OwnReads(host=HOST, port=port),
        OwnWrites(host=HOST, port=port),
        redis.asyncio.Connection(host=HOST, port=port, protocol=2, parser_class=OtherParser),
    ]:
        await connection.connect()
        assert not wire.direct(connection), (type(connection), type(connection._parser))
        # ... and such connections still work, through redis-py.
        await connection.send_packed_command(pack(("PING",)))
        assert await connection.read_response() == b"PONG"
        await connection.disconnect()


async def test_a_locks_fast_path_writes_and_reads_directly(redis_server, monkeypatch):
    direct_io = {"writes": 0, "reads": 0}
    write, read_reply = io.write, io.read_reply

    def counted_write(*args):
        direct_io["writes"] += 1
        return write(*args)

    def counted_read(*args):
        direct_io["reads"] += 1
        return read_reply(*args)

    monkeypatch.setattr(io, "write", counted_write)
    monkeypatch.setattr(io, "read_reply", counted_read)
    backend = Backend(
        redis.Redis(host=HOST, port=redis_server.port),
        async_client=redis.asyncio.Redis(host=HOST, port=redis_server.port),
    )
    try:
        lock = Lock("direct", backend=backend, timeout=10)
        for _ in range(3):
            assert await lock.aacquire()
            await lock.arelease()  # a release carries its request through: direct too
        # Scripts may be loaded on the first use (NOSCRIPT, then EVAL): at least one
        # write and one read per request, all of them direct.
        assert direct_io["writes"] >= 6
        assert direct_io["reads"] >= direct_io["writes"]
    finally:
        with contextlib.suppress(Exception):
            await close_backend(backend)
