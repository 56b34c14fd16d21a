"""Watchdog isolation (issue 9, item 5): one lock's trouble (a stalled server, a slow
``on_lost`` callback or observer, a stalled connection) must not cost other locks their
renewals, and a holder still learns it lost its lock by its lease end."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_distlock.engine import Lock
from tests.support.engine import Recorder, lock_key, stored_lock


def lease_end(lock: Lock) -> float:
    """The end of ``lock``'s current lease on the monotonic clock."""
    return time.monotonic() + (lock.valid_until - time.time())


class SlowCallback:
    """Blocks for ``seconds`` (or until :meth:`finish`) when called for an event of
    ``kind`` or, without ``kind``, whenever called."""

    def __init__(self, seconds: float, kind: str | None = None) -> None:
        self.seconds = seconds
        self.kind = kind
        self.calls = 0
        self._done = threading.Event()

    def __call__(self, subject: object) -> None:
        if self.kind is not None and getattr(subject, "kind", None) != self.kind:
            return
        self.calls += 1
        self._done.wait(self.seconds)

    def finish(self) -> None:
        """Let every pending and later call return at once (so no thread of this test
        is still blocked in the next one)."""
        self._done.set()


def still_held(client, lock: Lock) -> bool:
    stored = stored_lock(client, lock.name)
    return not lock.lost and stored is not None and stored.token == lock.token


async def test_a_stalled_server_does_not_cost_locks_on_another_server_their_renewals(
    api, redis_server_factory, make_backend
):
    """Lock A's server stalls; lock B lives on another server. B must keep being renewed,
    and A's holder must be told by A's lease end.

    A's lease (3 s) is longer than B's (1 s) so that the outcome before the fix does not
    hang on sub-millisecond ordering: the one sync watchdog thread waits out A's renewal
    until A's lease end, 2 s during which B (lease 1 s) is not renewed. (With equal
    leases B's lease would end within a renewal round trip of A's and B would survive or
    not by chance.) Async renewals are separate tasks and pass already."""
    stalled, healthy = redis_server_factory(), redis_server_factory()
    lost_at: list[float] = []
    a = Lock(
        "a",
        backend=make_backend(stalled),
        timeout=3.0,
        on_lost=lambda _: lost_at.append(time.monotonic()),
    )
    b = Lock("b", backend=make_backend(healthy), timeout=1.0)
    assert await api.acquire(a, blocking=False)
    assert await api.acquire(b, blocking=False)
    a_ends = lease_end(a)  # no renewal of A before 1 s: this is its lease end
    stalled.pause()
    try:
        await asyncio.sleep(a_ends - time.monotonic() + 0.5)  # 3.5 leases of B
        with healthy.client() as probe:
            assert still_held(probe, b), "the stalled server's lock held up the other's renewals"
        assert lost_at, "the holder of the lock on the stalled server was not told"
        assert lost_at[0] <= a_ends + 0.25, f"told {lost_at[0] - a_ends:.3f}s after its lease end"
        await api.release(b)
    finally:
        stalled.resume()


async def test_a_slow_on_lost_callback_does_not_hold_up_other_renewals(
    api, private_redis, make_backend
):
    lease = 1.0
    backend = make_backend(private_redis)
    slow = SlowCallback(5)
    a = Lock("a", backend=backend, timeout=lease, on_lost=slow)
    b = Lock("b", backend=backend, timeout=lease)
    assert await api.acquire(a, blocking=False)
    assert await api.acquire(b, blocking=False)
    try:
        with private_redis.client() as probe:
            probe.delete(lock_key("a"))  # a's next renewal finds it gone: on_lost runs
            await asyncio.sleep(3 * lease)
            assert still_held(probe, b), "a slow on_lost held up the other lock's renewals"
            assert slow.calls == 1
    finally:
        slow.finish()
    await api.release(b)


async def test_a_slow_observer_does_not_hold_up_other_renewals(api, private_redis, make_backend):
    lease = 1.0
    slow = SlowCallback(3, kind="lost")
    backend = make_backend(private_redis, observer=slow)
    a = Lock("a", backend=backend, timeout=lease)
    b = Lock("b", backend=backend, timeout=lease)
    assert await api.acquire(a, blocking=False)
    assert await api.acquire(b, blocking=False)
    try:
        with private_redis.client() as probe:
            probe.delete(lock_key("a"))
            await asyncio.sleep(3 * lease)
            assert still_held(probe, b), "a slow observer held up the other lock's renewals"
            assert slow.calls == 1
    finally:
        slow.finish()
    await api.release(b)


@pytest.mark.parametrize("lease", [2.0, 1.5])
async def test_renewals_get_past_a_stalled_connection(
    api, private_redis, make_proxy, make_backend, lease
):
    """The connection renewals use stops answering (a half-dead TCP connection, a
    middlebox dropping it silently) while new connections work: each renewal attempt
    must give up quickly and retry on a fresh connection, well before the lease ends
    (regression, 1.5 s: the renewal due with 1 s of lease left waited the whole second
    for its answer, and no time was left to retry; it waits half of what is left now)."""
    proxy = make_proxy(private_redis)
    recorder = Recorder()
    backend = make_backend(port=proxy.port, observer=recorder)
    lock = Lock("renewed", backend=backend, timeout=lease)
    assert await api.acquire(lock, blocking=False)
    await asyncio.sleep(lease / 3 + 0.2)  # the first renewal ran: its connection is open
    proxy.stall_existing()
    await asyncio.sleep(3 * lease)
    with private_redis.client() as probe:
        assert still_held(probe, lock), f"lost: {[e.reason for e in recorder.of('lost')]}"
    proxy.resume()
    await api.release(lock)


async def test_a_holder_cut_off_from_redis_learns_it_lost_by_its_lease_end(
    api, private_redis, make_proxy, make_backend
):
    """Passes before the fix too (renewals are bounded by the lease); a guard for the
    renewal rework."""
    lease = 1.5
    proxy = make_proxy(private_redis)
    lost_at: list[float] = []
    backend = make_backend(port=proxy.port)
    lock = Lock(
        "cut-off",
        backend=backend,
        timeout=lease,
        on_lost=lambda _: lost_at.append(time.monotonic()),
    )
    assert await api.acquire(lock, blocking=False)
    await asyncio.sleep(lease / 3 + 0.1)
    ends = lease_end(lock)
    proxy.stall()
    await asyncio.sleep(0.05)
    ends = max(ends, lease_end(lock))
    await asyncio.sleep(lease + 0.5)
    assert lost_at, "the holder was not told it lost the lock"
    assert lost_at[0] <= ends + 0.25, f"told {lost_at[0] - ends:.3f}s after its lease end"
    assert lock.lost
    proxy.resume()
