"""The TCP proxy of the fault tests (``tests/support/proxy.py``): forwarding, stalls, cuts
and delays."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.proxy import ProxyError, TcpProxy, sends_command

PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"


def raw_connection(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answered(sock: socket.socket, request: bytes = PING, within: float = 2.0) -> bytes | None:
    """Send ``request`` and return the first reply bytes, or ``None`` if nothing came."""
    sock.sendall(request)
    return read_within(sock, within)


def read_within(sock: socket.socket, within: float) -> bytes | None:
    sock.settimeout(within)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return None


def is_closed(sock: socket.socket) -> bool:
    """True when the peer closed ``sock`` (orderly or with a reset)."""
    sock.settimeout(2)
    try:
        sock.sendall(PING)
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def resp(*parts: str) -> bytes:
    out = b"*%d\r\n" % len(parts)
    for part in parts:
        out += b"$%d\r\n%s\r\n" % (len(part.encode()), part.encode())
    return out


def wait_for(predicate, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_the_proxy_forwards_commands_and_pipelines(private_redis, make_proxy):
    proxy = make_proxy(private_redis)
    with redis.Redis(port=proxy.port) as client:
        started = time.monotonic()
        for i in range(2000):
            client.set("key", i)
        assert time.monotonic() - started < 5
        pipe = client.pipeline(transaction=False)
        for i in range(20_000):
            pipe.set(f"key:{i}", "x" * 200)
        pipe.execute()
        assert client.get("key") == b"1999"
        assert client.dbsize() == 20_001
        assert proxy.connection_count == 1
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"


def test_stall_silences_current_and_new_connections_until_resume(private_redis, make_proxy):
    proxy = make_proxy(private_redis)
    old = raw_connection(proxy)
    assert answered(old) == PONG
    proxy.stall()
    new = raw_connection(proxy)
    assert answered(old, within=0.3) is None
    assert answered(new, within=0.3) is None
    assert proxy.connection_count == 2  # both open
    proxy.resume()
    assert read_within(old, 2) == PONG  # what was held back goes through, in order
    assert read_within(new, 2) == PONG
    old.close()
    new.close()


def test_stall_existing_spares_later_connections(private_redis, make_proxy):
    proxy = make_proxy(private_redis)
    old = raw_connection(proxy)
    assert answered(old) == PONG
    proxy.stall_existing()
    new = raw_connection(proxy)
    assert answered(new) == PONG
    assert answered(old, within=0.3) is None
    proxy.resume()
    assert read_within(old, 2) == PONG
    old.close()
    new.close()


def test_cut_resets_every_connection(private_redis, make_proxy):
    proxy = make_proxy(private_redis)
    client = redis.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    blocked: list[BaseException] = []

    def block() -> None:
        try:
            client.blpop("nothing", 30)
        except redis.ConnectionError as exc:
            blocked.append(exc)

    sock = raw_connection(proxy)
    assert answered(sock) == PONG
    thread = threading.Thread(target=block)
    thread.start()
    wait_for(lambda: proxy.connection_count == 2)
    with private_redis.client() as probe:
        wait_for(lambda: probe.info("clients")["blocked_clients"] == 1)
    proxy.cut()
    thread.join(5)
    assert len(blocked) == 1
    assert is_closed(sock)
    assert proxy.connection_count == 0
    with private_redis.client() as probe:  # the server side was closed as well
        wait_for(lambda: probe.info("clients")["connected_clients"] == 1)
    sock.close()
    client.close()
    with raw_connection(proxy) as sock:
        assert answered(sock) == PONG  # new connections still work


def test_delay_holds_matching_chunks_and_keeps_the_order(private_redis, make_proxy):
    proxy = make_proxy(private_redis)
    proxy.delay_client_data(sends_command("BLPOP"), 0.3)
    sock = raw_connection(proxy)
    other = raw_connection(proxy)
    started = time.monotonic()
    sock.sendall(resp("BLPOP", "list", "0.05"))
    time.sleep(0.02)  # a separate chunk, behind the delayed one
    sock.sendall(PING)
    assert answered(other) == PONG  # other connections are not held up
    assert time.monotonic() - started < 0.2
    reply = b""
    while not reply.endswith(PONG):
        chunk = read_within(sock, 2)
        assert chunk
        reply += chunk
    assert reply == b"*-1\r\n" + PONG or reply == b"_\r\n" + PONG
    assert time.monotonic() - started >= 0.3
    proxy.clear_delays()
    assert answered(other, resp("RPUSH", "list", "x")) == b":1\r\n"
    started = time.monotonic()
    # Returns at once: [list, x].
    assert answered(sock, resp("BLPOP", "list", "1")) == b"*2\r\n$4\r\nlist\r\n$1\r\nx\r\n"
    assert time.monotonic() - started < 0.2
    assert sends_command("BLPOP")(b"*2\r\n$4\r\nEVAL\r\n$12\r\nreturn BLPOP\r\n") is False
    sock.close()
    other.close()


def test_close_stops_the_thread_and_closes_sockets(private_redis):
    before = threading.active_count()
    proxy = TcpProxy("127.0.0.1", private_redis.port)
    sock = raw_connection(proxy)
    assert answered(sock) == PONG
    proxy.close()
    proxy.close()  # idempotent
    assert threading.active_count() == before
    assert is_closed(sock)
    with pytest.raises(ProxyError):
        proxy.stall()
    with pytest.raises(ConnectionRefusedError):
        raw_connection(proxy)
    sock.close()


def test_a_dead_target_refuses_through_the_proxy(make_proxy, private_redis):
    proxy = make_proxy(private_redis)
    private_redis.kill()
    try:
        sock = raw_connection(proxy)
    except ConnectionResetError:
        pass  # reset before connect() even returned
    else:
        assert is_closed(sock)
        sock.close()
    wait_for(lambda: proxy.connection_count == 0)
