"""A reply left unread on a pooled connection must never be taken for the reply of the
next request on it. An acquire with ``min_replicas`` sends its script and a ``WAIT`` in
one round trip; when the script is refused (``MOVED``, ``OOM``, ``NOREPLICAS``) the
``WAIT`` still runs on the server and answers later. A connection given back to the pool
with that answer still in flight hands it to the next request: an acquire of a lock that
somebody else holds then reads the ``WAIT``'s integer as "taken, fence 0".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from redis.crc import key_slot

from django_distlock.engine import Backend, Lock, LockBackendUnavailable, LockError
from tests.support.engine import close_backend, lock_key
from tests.support.redis_servers import RedisServer
from tests.support.topologies import ClusterSetup

REPLICA_TIMEOUT = 0.5


def slot_of(name: str) -> int:
    return key_slot(lock_key(name).encode())


def two_names_on_one_primary(cluster: ClusterSetup, stem: str) -> tuple[str, str, RedisServer]:
    """Names ``x`` and ``y`` whose lock keys live on the same primary, in different
    slots (so that the slot of ``x`` can move away while ``y`` stays)."""
    x = f"{stem}-x"
    primary = cluster.primary_for_slot(slot_of(x))
    for i in range(10_000):
        y = f"{stem}-y{i}"
        if slot_of(y) != slot_of(x) and cluster.primary_for_slot(slot_of(y)) is primary:
            return x, y, primary
    raise AssertionError("no second name on the same primary")  # pragma: no cover


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    server.pause()
    try:
        yield
    finally:
        server.resume()


class StrayWaitScenario:
    """Everything up to the acquire of ``x`` whose ``WAIT`` is left unread.

    Another owner (a backend of its own) holds ``y``. Our backend (``min_replicas=1``)
    took and gave back ``x`` once, so its pool has a connection to the primary P1 of
    both names. The slot of ``x`` is then moved to another primary P2, and P1's replica
    is paused (SIGSTOP): a ``WAIT`` on P1 for a write made since blocks for the whole
    replica timeout. A lock ``z`` on P1, taken and released without replicas on the same
    pooled connection, makes such a write (the earlier writes of that connection were
    acknowledged before the pause). Our acquire of ``x`` then goes to P1 with its stale
    slot map, gets ``MOVED`` for the script and follows it to P2, while P1's ``WAIT`` has
    not answered yet.
    """

    def __init__(self, cluster: ClusterSetup, stem: str) -> None:
        self.cluster = cluster
        self.x, self.y, self.primary = two_names_on_one_primary(cluster, stem)
        self.target = next(node for node in cluster.primaries if node is not self.primary)
        (self.replica,) = cluster.replicas_of(self.primary)
        self.z = next(
            f"{stem}-z{i}"
            for i in range(10_000)
            if slot_of(f"{stem}-z{i}") not in (slot_of(self.x), slot_of(self.y))
            and cluster.primary_for_slot(slot_of(f"{stem}-z{i}")) is self.primary
        )
        self.ours = Backend(
            cluster=cluster.urls, min_replicas=1, replica_timeout=REPLICA_TIMEOUT, timeout=30
        )
        self.other = Backend(cluster=cluster.urls, timeout=30)
        self.holder = Lock(self.y, backend=self.other, auto_renew=False)

    def before_pause(self) -> None:
        """Run in a thread for the async test: everything blocking up to the pause."""
        self.cluster.wait_replicas_in_sync()
        self.cluster.migrate_slot(slot_of(self.x), self.target)
        self.cluster.wait_replicas_in_sync()

    async def close(self) -> None:
        await close_backend(self.ours)
        await close_backend(self.other)


@pytest.mark.parametrize("y_replicas", [1, 0], ids=["y-min-replicas-1", "y-min-replicas-0"])
async def test_an_unread_wait_reply_is_not_taken_for_the_next_acquire(
    api, private_cluster, y_replicas
):
    """After an acquire of ``x`` whose script got ``MOVED`` on P1 (its ``WAIT`` still
    blocked there on a paused replica), a non-blocking acquire of ``y``, held by another
    owner, on the same backend must return False (or raise ``LockBackendUnavailable``).

    Today it reads the stale ``WAIT`` integer as its script's reply ("taken, fence 0"):
    with ``min_replicas=0`` on ``y`` it returns True (two holders); with ``y`` inheriting
    the backend's ``min_replicas=1`` it then reads its own script's reply as its
    ``WAIT``'s and a ``TypeError`` escapes."""
    scenario = StrayWaitScenario(private_cluster, f"stray-{api.name}-{y_replicas}")
    assert scenario.holder.acquire(blocking=False)
    x = Lock(scenario.x, backend=scenario.ours, auto_renew=False)
    y = Lock(scenario.y, backend=scenario.ours, auto_renew=False, min_replicas=y_replicas)
    z = Lock(scenario.z, backend=scenario.ours, auto_renew=False, min_replicas=0)
    try:
        assert await api.acquire(x, blocking=False)
        await api.release(x)
        await asyncio.to_thread(scenario.before_pause)
        with paused(scenario.replica):
            assert await api.acquire(z, blocking=False)  # a write the replica never acks
            await api.release(z)
            assert await api.acquire(x, blocking=False)  # MOVED from P1, taken on P2
            try:  # at once: P1's WAIT for x answers only after the replica timeout
                got_y = await api.acquire(y, blocking=False)
            except LockBackendUnavailable:
                got_y = False
            assert got_y is False, f"y taken while another owner holds it (fence {y.fence})"
            assert scenario.holder.owned()
    finally:
        for mine in (y, x):
            with contextlib.suppress(Exception):
                if mine.held:
                    await api.release(mine)
        with contextlib.suppress(Exception):
            scenario.holder.release()
        await scenario.close()


# -- a single server refusing the acquire script (OOM, NOREPLICAS) ---------------------

RACE_SECONDS = 5.0
REFUSED_REPLICA_TIMEOUT = 0.1
HELD_NAMES = 8
REFUSED_WORKERS = 4


def refuse_writes(server: RedisServer, refusal: str) -> None:
    """Make ``server`` refuse the acquire script: out of memory (``noeviction``, and
    ``maxmemory`` 1 MB below what a 4 MB value made it use) or too few replicas
    (``min-replicas-to-write 1`` on a server that has none).

    The value is made by ``SETRANGE`` at a 4 MB offset: a ``SET`` of 4 MB would leave a
    query buffer of that size, freed a moment later, and the server under its limit."""
    with server.client() as admin:
        if refusal == "oom":
            admin.config_set("maxmemory-policy", "noeviction")
            admin.setrange("ballast", 4_000_000, "x")
            admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 1_000_000)
        else:
            admin.config_set("min-replicas-to-write", 1)


def allow_writes(server: RedisServer) -> None:
    with server.client() as admin:
        admin.config_set("maxmemory", 0)
        admin.config_set("min-replicas-to-write", 0)
        admin.delete("ballast")


class Tally:
    """What the contenders saw; ``violations`` are outcomes that must never happen."""

    def __init__(self) -> None:
        self.refused = 0  # LockBackendUnavailable for a name nobody holds
        self.busy = 0  # False for a name another owner holds
        self.rounds = 0
        self.violations: list[str] = []
        self.wrongly_held: list[Lock] = []
        self._lock = threading.Lock()

    def refused_acquire(self, outcome: object, lock: Lock) -> None:
        with self._lock:
            if isinstance(outcome, LockBackendUnavailable):
                self.refused += 1
            else:
                self.violations.append(f"refused acquire of {lock.name}: {outcome!r}")

    def held_acquire(self, outcome: object, lock: Lock) -> bool:
        """Count ``outcome``; False once it is a violation (the caller stops)."""
        with self._lock:
            if outcome is False:
                self.busy += 1
                return True
            else:
                fence = lock.fence if outcome is True else None
                self.violations.append(f"acquire of held {lock.name}: {outcome!r} (fence {fence})")
                if outcome is True:
                    self.wrongly_held.append(lock)
                return False


@pytest.mark.parametrize("refusal", ["oom", "noreplicas"])
async def test_a_refused_acquire_leaves_no_stray_reply_for_other_acquires(
    api, private_redis, make_backend, refusal
):
    """A single server refuses the acquire script (``OOM``, ``NOREPLICAS``) while the
    backend asks for ``min_replicas=1``: with no replica, each ``WAIT`` sent with the
    script blocks for the replica timeout and then answers 0. In rounds, each on a new
    backend (a cold pool), several threads (tasks) at once take a free name each (the
    refused acquires) while others take names another owner holds (taken before the
    refusals began), with ``min_replicas=1`` or none, until the refused ``WAIT``s have
    answered. Every refused acquire must raise ``LockBackendUnavailable``; every acquire
    of a held name must return False.

    Today the refused acquire gives its connection back with the ``WAIT`` unread. Its
    own clean-up (a release of its token) usually takes that connection again (and
    reads the ``WAIT`` as the release's reply, leaving the release's reply for the
    pool's stray-bytes check to drop), but another thread's acquire can get it first:
    it reads the ``WAIT``'s 0 as "taken, fence 0" and returns True, a second holder (or
    a ``TypeError``, reading its script's reply as its ``WAIT``'s). About half the sync
    rounds show it (a cold pool: threads opening connections, the refused acquire
    switched out between giving its connection back and its clean-up). One event
    loop's tasks cannot get in between (the clean-up takes the connection back without
    yielding), so the async run passes today: a regression guard."""
    other = make_backend(private_redis, timeout=60, auto_renew=False)
    holders = [Lock(f"held-{i}", backend=other) for i in range(HELD_NAMES)]
    for holder in holders:
        assert holder.acquire(blocking=False)

    def ours() -> Backend:
        return make_backend(
            private_redis,
            timeout=60,
            auto_renew=False,
            min_replicas=1,
            replica_timeout=REFUSED_REPLICA_TIMEOUT,
        )

    tally = Tally()
    refuse_writes(private_redis, refusal)
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline and not tally.violations:
            if api.name == "sync":
                await asyncio.to_thread(round_in_threads, ours(), holders, tally)
            else:
                await round_in_tasks(ours(), holders, tally)
    finally:
        allow_writes(private_redis)
    for lock in tally.wrongly_held:
        with contextlib.suppress(LockError):
            lock.release()
    assert tally.violations == [], f"{tally.violations[:5]} in round {tally.rounds}"
    assert tally.refused > 0
    assert tally.busy > 0
    for holder in holders:
        assert holder.owned(), holder.name
        holder.release()


def contenders_on(ours: Backend, holders: list[Lock]) -> list[Lock]:
    """Our locks on the names ``holders`` hold: half ask for the backend's
    ``min_replicas=1``, half for none."""
    return [Lock(holder.name, backend=ours, min_replicas=i % 2) for i, holder in enumerate(holders)]


def round_in_threads(ours: Backend, holders: list[Lock], tally: Tally) -> None:
    """One round: threads released at once take a free name each (refused) while
    others take the held names (busy) until the refused ``WAIT``s have answered."""
    tally.rounds += 1
    contenders = contenders_on(ours, holders)
    start = threading.Barrier(REFUSED_WORKERS + len(contenders))
    refusing = threading.Semaphore(0)

    def refused(worker: int) -> None:
        lock = Lock(f"free-{tally.rounds}-{worker}", backend=ours)
        start.wait()
        try:
            tally.refused_acquire(outcome_of(functools.partial(lock.acquire, blocking=False)), lock)
        finally:
            refusing.release()

    def held(lock: Lock) -> None:
        start.wait()
        until = None
        while until is None or time.monotonic() < until:
            outcome = outcome_of(functools.partial(lock.acquire, blocking=False))
            if not tally.held_acquire(outcome, lock):
                return
            if until is None and refused_all():
                until = time.monotonic() + REFUSED_REPLICA_TIMEOUT + 0.05

    done = [0]
    done_lock = threading.Lock()

    def refused_all() -> bool:
        with done_lock:
            while refusing.acquire(blocking=False):
                done[0] += 1
            return done[0] == REFUSED_WORKERS

    threads = [threading.Thread(target=refused, args=(i,)) for i in range(REFUSED_WORKERS)]
    threads += [threading.Thread(target=held, args=(lock,)) for lock in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


async def round_in_tasks(ours: Backend, holders: list[Lock], tally: Tally) -> None:
    """Async twin of :func:`round_in_threads`: tasks of one event loop."""
    tally.rounds += 1
    contenders = contenders_on(ours, holders)
    start = asyncio.Event()
    refused_left = [REFUSED_WORKERS]

    async def refused(worker: int) -> None:
        lock = Lock(f"free-{tally.rounds}-{worker}", backend=ours)
        await start.wait()
        try:
            tally.refused_acquire(await aoutcome_of(lock.aacquire(blocking=False)), lock)
        finally:
            refused_left[0] -= 1

    async def held(lock: Lock) -> None:
        await start.wait()
        until = None
        while until is None or time.monotonic() < until:
            if not tally.held_acquire(await aoutcome_of(lock.aacquire(blocking=False)), lock):
                return
            if until is None and refused_left[0] == 0:
                until = time.monotonic() + REFUSED_REPLICA_TIMEOUT + 0.05

    tasks = [asyncio.ensure_future(refused(i)) for i in range(REFUSED_WORKERS)]
    tasks += [asyncio.ensure_future(held(lock)) for lock in contenders]
    await asyncio.sleep(0)
    start.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


def outcome_of(call: Callable[[], bool]) -> object:
    try:
        return call()
    except Exception as exc:
        return exc


async def aoutcome_of(call: Awaitable[bool]) -> object:
    try:
        return await call
    except Exception as exc:
        return exc
