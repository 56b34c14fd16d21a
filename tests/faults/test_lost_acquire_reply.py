"""An acquire whose request reached Redis but whose reply was lost (the connection broke
on the way back): the script ran, so the lock may be held with the token of an acquire
that never heard of it. The caller must then get either the lock (``True``, and it owns
it) or ``LockBackendUnavailable`` with nothing left held under that acquire's token once
Redis answers again; never ``False``, "busy", because of its own token.

A :class:`TcpProxy` sits between the backend and a private server; its
:meth:`~TcpProxy.lose_reply` rule forwards the acquire and cuts that connection when
the reply comes back (new connections work)."""

from __future__ import annotations

import time

import pytest
import redis

from django_distlock.engine import Lock, LockBackendUnavailable, LockGroup
from django_distlock.engine.protocol.scripts import RELEASE
from tests.support.engine import await_until, keys_of, lock_key, sync_client
from tests.support.proxy import sends_command

NAME = "lost-reply"
LEASE = 30.0
GONE_WITHIN = 3.0


def acquire_of(name: str):
    """A chunk predicate: the ``EVALSHA`` of an acquire (or release) of ``name``."""
    evalsha = sends_command("EVALSHA")
    key = lock_key(name).encode()
    return lambda chunk: evalsha(chunk) and key in chunk


def test_lose_reply_runs_the_request_and_cuts_only_its_connection(private_redis, make_proxy):
    """The proxy mode itself: the server runs the request, the client gets a reset
    instead of the reply, and a new connection through the proxy works."""
    proxy = make_proxy(private_redis)
    client = sync_client(proxy.port)
    try:
        assert client.ping()
        proxy.lose_reply(sends_command("SET"))
        with pytest.raises(redis.ConnectionError):
            client.set("lost", "ran")
        assert proxy.replies_lost == 1
        with private_redis.client() as direct:
            assert direct.get("lost") == b"ran"
        assert client.get("lost") == b"ran"  # a new connection, through the proxy
        assert proxy.replies_lost == 1
    finally:
        client.close()


def test_redis_py_sends_a_script_whose_reply_was_lost_again(private_redis, make_proxy):
    """Why the engine never lets redis-py retry (docs/architecture.md, "no blind
    retries"): a client with redis-py's default ``Retry`` (10 retries on
    ``ConnectionError``/``TimeoutError``) runs a release whose reply was lost a second
    time, and that second run, finding the lock gone, reports a release that worked as a
    lock no longer owned."""
    proxy = make_proxy(private_redis)
    client = redis.Redis(host="127.0.0.1", port=proxy.port)  # redis-py's default retry
    try:
        lock = client.lock("redis-py-lock", timeout=30)
        assert lock.acquire(blocking=False)
        client.script_load(lock.lua_release.script)  # EVALSHA runs it, no NOSCRIPT first
        with private_redis.client() as direct:
            direct.config_resetstat()
            proxy.lose_reply(sends_command("EVALSHA"))
            with pytest.raises(redis.exceptions.LockNotOwnedError):
                lock.release()
            assert proxy.replies_lost == 1
            ran = direct.info("commandstats")["cmdstat_evalsha"]["calls"]
            assert ran == 2, "the release ran, its reply was lost, and redis-py sent it again"
            assert direct.exists("redis-py-lock") == 0  # the first run did release it
    finally:
        client.close()


@pytest.mark.parametrize("blocking", [False, True], ids=["non-blocking", "blocking"])
async def test_an_acquire_whose_reply_is_lost_holds_or_leaves_nothing(
    api, private_redis, make_proxy, make_backend, blocking
):
    """The acquire's ``EVALSHA`` reaches the server (the lock is written under the
    acquire's token) and its reply is lost. The acquire must return True and own the
    lock, or raise ``LockBackendUnavailable`` and leave no lock behind (checked on the
    server itself, within a few seconds); returning False would mean it found the lock
    "busy" with its own token (an acquire retried after the lost reply), and the lock
    would stay held by nobody for the whole lease."""
    proxy = make_proxy(private_redis)
    backend = make_backend(port=proxy.port, timeout=LEASE, auto_renew=False)
    warm_up = Lock(f"{NAME}-warm-up", backend=backend)
    assert await api.acquire(warm_up, blocking=False)  # scripts loaded, layout claimed
    await api.release(warm_up)
    lock = Lock(NAME, backend=backend)
    proxy.lose_reply(acquire_of(NAME))
    began = time.monotonic()
    try:
        outcome: object = await api.acquire(lock, blocking=blocking, blocking_timeout=5)
    except LockBackendUnavailable as exc:
        outcome = exc
    took = time.monotonic() - began
    assert proxy.replies_lost == 1, "the acquire's reply was not the one lost"
    with private_redis.client() as direct:
        if outcome is True:
            assert await api.owned(lock)
            stored = direct.get(lock_key(NAME))
            assert stored is not None
            assert stored.startswith(lock.token.encode())
            await api.release(lock)
        else:
            assert isinstance(outcome, LockBackendUnavailable), (
                f"acquire returned {outcome!r} after {took:.2f}s: its own lock made it busy"
            )
            assert lock.held is False
            try:
                await await_until(lambda: not direct.exists(lock_key(NAME)), GONE_WITHIN)
            except AssertionError:
                pytest.fail(
                    f"the lost acquire's lock is still held {GONE_WITHIN}s later, "
                    f"for {direct.pttl(lock_key(NAME))} ms more"
                )
    # Whatever happened, the name is free again for anybody.
    other = Lock(NAME, backend=make_backend(private_redis))
    assert await api.acquire(other, blocking=False)
    await api.release(other)


async def test_a_lock_whose_give_back_could_not_reach_redis_is_given_back_once_it_answers(
    api, private_redis, make_proxy, make_backend
):
    """The acquire's reply is lost and Redis stays out of reach a moment longer, so the
    acquire's own clean-up fails too: the lock is still given back by its token as soon
    as Redis answers again (the watchdog keeps trying), not left held for the lease."""
    proxy = make_proxy(private_redis)
    backend = make_backend(
        port=proxy.port,
        timeout=LEASE,
        auto_renew=False,
        client_kwargs={"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    )
    warm_up = Lock(f"{NAME}-warm-up", backend=backend)
    assert await api.acquire(warm_up, blocking=False)
    await api.release(warm_up)
    lock = Lock(NAME, backend=backend)
    proxy.lose_reply(acquire_of(NAME))
    # The acquire's clean-up (a release by its token) gets no answer in time either.
    release = RELEASE.sha.encode()
    proxy.delay_client_data(lambda chunk: release in chunk, 30.0)
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(lock, blocking=False)
    assert proxy.replies_lost == 1
    proxy.clear_delays()
    proxy.cut()  # the held-back clean-up never reaches Redis
    with private_redis.client() as direct:
        stored = direct.get(lock_key(NAME))
        assert stored is not None, "the acquire never reached Redis"
        began = time.monotonic()
        await await_until(lambda: direct.exists(lock_key(NAME)) == 0, within=GONE_WITHIN)
        assert time.monotonic() - began < GONE_WITHIN < LEASE


def once(predicate):
    """``predicate``, true for its first matching chunk only."""
    matched = []

    def first(chunk: bytes) -> bool:
        if matched or not predicate(chunk):
            return False
        matched.append(chunk)
        return True

    return first


@pytest.mark.parametrize("reentrant", [False, True], ids=["mutex", "reentrant"])
@pytest.mark.parametrize("blocking", [False, True], ids=["non-blocking", "blocking"])
async def test_an_acquire_answered_after_its_lease_is_over_is_not_a_hold(
    api, private_redis, make_proxy, make_backend, blocking, reentrant
):
    """Found by the randomized fault runs (issue 20): an acquire held up longer than its
    lease (here its request; a stalled reply looks the same to the client) returned True
    with its lease already spent, and three holders of a ``limit=2`` lock overlapped. It
    must give that hold back: not acquired (non-blocking), or acquired afresh with a
    lease ahead of it (blocking). A re-entrant lock's first acquire is the same (issue
    27: the spent re-entrant hold of the 2026-11-28 Cluster run was suspected of
    skipping this rule)."""
    proxy = make_proxy(private_redis)
    backend = make_backend(port=proxy.port)
    lock = Lock(NAME, backend=backend, timeout=0.3, auto_renew=False, reentrant=reentrant)
    warm_up = Lock("warm-up", backend=backend, timeout=5)
    await api.acquire(warm_up, blocking=False)  # connections open before the delay
    await api.release(warm_up)
    proxy.delay_client_data(once(acquire_of(NAME)), 0.5)
    got = await api.acquire(lock, blocking=blocking, blocking_timeout=5 if blocking else None)
    if blocking:
        assert got is True
        assert lock.held
        assert not lock.lost
        assert lock.valid_until > time.time()
        await api.release(lock)
    else:
        assert got is False
        assert not lock.held
    with private_redis.client() as direct:
        assert direct.exists(lock_key(NAME)) == 0  # the spent hold was given back


def test_a_group_answered_after_its_lease_is_over_is_not_held(
    private_redis, make_proxy, make_backend
):
    """The same for several names at once: the group gives its names back and is not
    acquired (it does not try again)."""
    proxy = make_proxy(private_redis)
    backend = make_backend(port=proxy.port)
    names = ["spent:1", "spent:2"]
    warm_up = LockGroup(names, backend=backend, timeout=5)
    assert warm_up.acquire(blocking=False)  # connections open before the delay
    warm_up.release()
    proxy.delay_client_data(once(acquire_of(names[0])), 0.5)
    group = LockGroup(names, backend=backend, timeout=0.3, auto_renew=False)
    assert group.acquire(blocking=False) is False
    assert not group.held
    with private_redis.client() as direct:
        assert not any(direct.exists(lock_key(name)) for name in names)


async def test_a_fair_waiter_whose_first_reply_is_lost_leaves_the_queue(
    api, private_redis, make_proxy, make_backend
):
    """Issue 27: the first attempt of a fair waiter reaches the server, which queues it
    (the lock is held), and its reply is lost. The waiter must take itself off the queue
    as it gives up, not leave a dead head that every fair caller waits behind until its
    place lapses."""
    holder = Lock(NAME, backend=make_backend(private_redis), fair=True, timeout=LEASE)
    assert await api.acquire(holder, blocking=False)
    proxy = make_proxy(private_redis)
    backend = make_backend(port=proxy.port, timeout=LEASE, auto_renew=False)
    warm_up = Lock(f"{NAME}-warm-up", backend=backend)
    assert await api.acquire(warm_up, blocking=False)
    await api.release(warm_up)
    waiter = Lock(NAME, backend=backend, fair=True)
    proxy.lose_reply(acquire_of(NAME))
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(waiter, blocking_timeout=5)
    assert proxy.replies_lost == 1
    with private_redis.client() as direct:
        assert direct.llen(keys_of(NAME).queue) == 0
    # The next fair caller gets the lock as soon as the holder lets it go.
    await api.release(holder)
    newcomer = Lock(NAME, backend=make_backend(private_redis), fair=True)
    began = time.monotonic()
    assert await api.acquire(newcomer, blocking_timeout=5)
    assert time.monotonic() - began < 0.5
    await api.release(newcomer)
