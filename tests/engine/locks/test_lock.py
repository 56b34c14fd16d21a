"""The Lock object against a real server: acquire/release, fences, metadata, leases,
queries, ownership, decorator, and input validation. Sync and async side by side."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_distlock.engine import (
    MAX_NAME_LENGTH,
    MAX_SECONDS,
    Backend,
    Lock,
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from tests.support.engine import (
    PREFIX,
    blocked_clients,
    in_other_thread,
    keys_matching,
    keys_of,
    lock_key,
    server_time_us,
    stored_lock,
    sync_client,
    wait_until,
)

EMOJI = "\N{GRINNING FACE}"


# -- acquire and release ----------------------------------------------------------------


async def test_acquire_and_release(api, backend, redis_client):
    lock = Lock("invoice:42", backend=backend, timeout=10)
    assert lock.held is False
    assert lock.fence is None
    assert lock.token is None

    assert await api.acquire(lock) is True
    assert lock.held is True
    assert isinstance(lock.fence, int)
    stored = stored_lock(redis_client, "invoice:42")
    assert stored.token == lock.token
    assert redis_client.zscore(keys_of("invoice:42").index, "invoice:42") == stored.lease_end_ms

    await api.release(lock)
    assert lock.held is False
    assert lock.fence is None
    assert lock.token is None
    assert redis_client.exists(lock_key("invoice:42")) == 0
    assert redis_client.zscore(keys_of("invoice:42").index, "invoice:42") is None


async def test_context_manager_holds_the_lock_inside_only(api, backend, redis_client):
    lock = Lock("cart:7", backend=backend)
    async with api.hold(lock) as entered:
        assert entered is lock
        assert lock.held
        assert redis_client.exists(lock_key("cart:7")) == 1
    assert not lock.held
    assert redis_client.exists(lock_key("cart:7")) == 0


async def test_context_manager_releases_when_the_body_raises(api, backend, redis_client):
    lock = Lock("cart:7", backend=backend)
    with pytest.raises(ZeroDivisionError):
        async with api.hold(lock):
            _ = 1 / 0
    assert redis_client.exists(lock_key("cart:7")) == 0
    assert not lock.held


async def test_the_same_object_can_be_acquired_again_after_release(api, backend):
    lock = Lock("again", backend=backend)
    fences = []
    for _ in range(3):
        async with api.hold(lock):
            fences.append(lock.fence)
    assert fences == sorted(set(fences))


async def test_busy_lock_non_blocking_acquire_fails_with_retry_after(api, backend):
    holder = Lock("busy", backend=backend, timeout=10)
    other = Lock("busy", backend=backend)
    await api.acquire(holder)
    started = time.monotonic()
    assert await api.acquire(other, blocking=False) is False
    assert time.monotonic() - started < 0.5
    assert 9 < other.retry_after <= 10
    assert other.held is False
    assert other.fence is None
    await api.release(holder)


async def test_positional_false_means_non_blocking(api, backend):
    # redis-py's sync acquire(False) binds False to `sleep`; ours means blocking=False.
    holder = Lock("busy", backend=backend)
    other = Lock("busy", backend=backend)
    await api.acquire(holder)
    started = time.monotonic()
    assert await api.acquire(other, False) is False
    assert time.monotonic() - started < 0.5
    await api.release(holder)


async def test_blocking_timeout_zero_does_not_wait(api, backend):
    holder = Lock("busy", backend=backend)
    other = Lock("busy", backend=backend, blocking_timeout=0)
    await api.acquire(holder)
    started = time.monotonic()
    assert await api.acquire(other) is False
    assert await api.acquire(Lock("busy", backend=backend), blocking_timeout=0) is False
    assert time.monotonic() - started < 0.5
    await api.release(holder)


async def test_blocking_timeout_elapses(api, backend):
    holder = Lock("busy", backend=backend, timeout=10)
    other = Lock("busy", backend=backend)
    await api.acquire(holder)
    started = time.monotonic()
    assert await api.acquire(other, blocking_timeout=0.3) is False
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.5
    assert 8 < other.retry_after <= 10
    await api.release(holder)


async def test_entering_a_busy_lock_raises_lock_not_acquired(api, backend):
    holder = Lock("busy", backend=backend, timeout=10)
    await api.acquire(holder)
    for waiter in (
        Lock("busy", backend=backend, blocking=False),
        Lock("busy", backend=backend, blocking_timeout=0.2),
    ):
        with pytest.raises(LockNotAcquired) as caught:
            async with api.hold(waiter):
                pytest.fail("entered a lock held by someone else")
        assert caught.value.name == "busy"
        assert 8 < caught.value.retry_after <= 10
        assert isinstance(caught.value, LockError)
    assert holder.held
    await api.release(holder)


async def test_lock_not_acquired_mentions_the_wait(api, backend):
    holder = Lock("busy", backend=backend)
    await api.acquire(holder)
    with pytest.raises(LockNotAcquired, match=r"'busy'.*0\.2s"):
        async with api.hold(Lock("busy", backend=backend, blocking_timeout=0.2)):
            pass
    await api.release(holder)


# -- fencing ----------------------------------------------------------------------------


async def test_fences_increase_strictly_per_name_and_independently(api, backend):
    a = Lock("a", backend=backend)
    b = Lock("b", backend=backend)
    fences_a, fences_b = [], []
    for _ in range(5):
        async with api.hold(a):
            fences_a.append(a.fence)
        async with api.hold(b):
            fences_b.append(b.fence)
    # Each name's fences increase strictly, whatever the other name does.
    assert fences_a == sorted(set(fences_a))
    assert fences_b == sorted(set(fences_b))
    assert len(fences_a) == len(fences_b) == 5


async def test_fence_is_seeded_from_the_server_clock_in_microseconds(api, backend, redis_client):
    lock = Lock("seeded", backend=backend)
    fence_key = keys_of("seeded").fence

    before = server_time_us(redis_client)
    async with api.hold(lock):
        first = lock.fence
    after = server_time_us(redis_client)
    assert before <= first <= after

    # Every fence is max(stored + 1, server clock in µs): next to the clock again.
    before = server_time_us(redis_client)
    async with api.hold(lock):
        assert lock.fence > first
        assert lock.fence >= before
        previous = lock.fence

    for forget in (lambda: redis_client.delete(fence_key), redis_client.flushall):
        forget()
        before = server_time_us(redis_client)
        async with api.hold(lock):
            fence = lock.fence
        after = server_time_us(redis_client)
        assert fence > previous
        assert before <= fence <= after
        previous = fence


async def test_fence_survives_a_counter_key_that_expired(api, make_backend, redis_client):
    from django_distlock.engine import Tuning

    backend = make_backend(tuning=Tuning(fence_memory=0.05))
    lock = Lock("short-counter", backend=backend, timeout=0.5, auto_renew=False)
    async with api.hold(lock):
        first = lock.fence
    # It outlives the lease by fence_memory.
    assert 400 < redis_client.pttl(keys_of("short-counter").fence) <= 550
    await asyncio.sleep(0.6)
    assert redis_client.exists(keys_of("short-counter").fence) == 0
    async with api.hold(lock):
        assert lock.fence > first


# -- what the lock key stores -----------------------------------------------------------


async def test_lock_key_stores_token_fence_time_lease_and_owner(api, backend, redis_client):
    lock = Lock("meta", backend=backend, timeout=12.5, context="billing\nline two ü€")
    before = server_time_us(redis_client)
    await api.acquire(lock)
    after = server_time_us(redis_client)
    raw = redis_client.get(lock_key("meta"))
    assert raw.count(b"\n") == 4  # the context's newline is escaped inside the JSON
    stored = stored_lock(redis_client, "meta")
    assert stored.token == lock.token
    assert stored.fence == lock.fence
    assert before <= stored.acquired_at_us <= after
    assert stored.lease_ms == 12_500
    if api.name == "sync":
        thread = threading.current_thread().name
    else:
        thread = asyncio.current_task().get_name()
    assert stored.owner == {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "thread": thread,
        "context": "billing\nline two ü€",
        "auto_renew": True,
    }
    await api.release(lock)


async def test_owner_records_auto_renew_off(api, backend, redis_client):
    lock = Lock("meta", backend=backend, auto_renew=False)
    async with api.hold(lock):
        assert stored_lock(redis_client, "meta").owner["auto_renew"] is False


def test_owner_thread_is_the_acquiring_thread(backend, redis_client):
    lock = Lock("meta", backend=backend)
    owners = []

    def acquire_in_thread():
        with lock:
            owners.append(stored_lock(redis_client, "meta").owner["thread"])

    thread = threading.Thread(target=acquire_in_thread, name="worker-7")
    thread.start()
    thread.join(timeout=10)
    assert owners == ["worker-7"]


async def test_owner_task_is_the_acquiring_task(backend, redis_client):
    lock = Lock("meta", backend=backend)

    async def job():
        async with lock:
            return stored_lock(redis_client, "meta").owner["thread"]

    assert await asyncio.create_task(job(), name="nightly-report") == "nightly-report"


# -- lease: ttl, valid_until, extend, reacquire -----------------------------------------


async def test_ttl_and_valid_until_after_acquire(api, backend):
    lock = Lock("lease", backend=backend, timeout=10, auto_renew=False)
    assert await api.ttl(lock) is None
    assert lock.valid_until is None
    await api.acquire(lock)
    ttl = await api.ttl(lock)
    assert 9.5 < ttl <= 10
    assert 9.5 < lock.valid_until - time.time() <= 10
    await api.release(lock)
    assert await api.ttl(lock) is None
    assert lock.valid_until is None


async def test_extend_adds_to_the_lease(api, backend, redis_client):
    lock = Lock("lease", backend=backend, timeout=10, auto_renew=False)
    await api.acquire(lock)
    deadline = await api.extend(lock, 5)
    assert 14.5 < deadline - time.time() <= 15
    assert 14_500 < redis_client.pttl(lock_key("lease")) <= 15_000
    assert 14.5 < await api.ttl(lock) <= 15
    assert abs(lock.valid_until - deadline) < 0.05
    deadline = await api.extend(lock, 0.5)
    assert 15 < deadline - time.time() <= 15.5


async def test_extend_with_replace_ttl_sets_the_lease(api, backend, redis_client):
    lock = Lock("lease", backend=backend, timeout=10, auto_renew=False)
    await api.acquire(lock)
    deadline = await api.extend(lock, 3, replace_ttl=True)
    assert 2.5 < deadline - time.time() <= 3
    assert 2_500 < redis_client.pttl(lock_key("lease")) <= 3_000
    deadline = await api.extend(lock, 0.25, replace_ttl=True)
    assert 0 < redis_client.pttl(lock_key("lease")) <= 250
    assert deadline - time.time() <= 0.25


async def test_reacquire_resets_the_full_lease(api, backend, redis_client):
    lock = Lock("lease", backend=backend, timeout=10, auto_renew=False)
    await api.acquire(lock)
    await api.extend(lock, 2, replace_ttl=True)
    deadline = await api.reacquire(lock)
    assert 9.5 < deadline - time.time() <= 10
    assert 9_500 < redis_client.pttl(lock_key("lease")) <= 10_000


async def test_lease_defaults_to_the_backend_timeout(api, make_backend, redis_client):
    backend = make_backend(timeout=7)
    async with api.hold(Lock("lease", backend=backend)):
        assert stored_lock(redis_client, "lease").lease_ms == 7_000
        assert 6_500 < redis_client.pttl(lock_key("lease")) <= 7_000
    async with api.hold(Lock("lease", backend=backend, timeout=2)):
        assert stored_lock(redis_client, "lease").lease_ms == 2_000


async def test_extend_or_release_without_holding_raises_lock_not_owned(api, backend):
    lock = Lock("nobody", backend=backend)
    with pytest.raises(LockNotOwned) as caught:
        await api.release(lock)
    assert caught.value.name == "nobody"
    assert not isinstance(caught.value, LockLost)
    with pytest.raises(LockNotOwned):
        await api.extend(lock, 1)
    with pytest.raises(LockNotOwned):
        await api.reacquire(lock)


async def test_extend_after_the_key_vanished_raises_lock_lost(api, backend, redis_client):
    lock = Lock("vanished", backend=backend, auto_renew=False)
    await api.acquire(lock)
    redis_client.delete(lock_key("vanished"))
    with pytest.raises(LockLost) as caught:
        await api.extend(lock, 5)
    assert caught.value.name == "vanished"
    assert lock.lost is True
    assert lock.held is False
    with pytest.raises(LockLost):
        await api.release(lock)
    # Released (as far as this holder can), but it still says what became of the hold.
    assert lock.lost is True
    assert "another holder" in lock.lost_reason
    assert lock.fence is None
    assert lock.token is None
    with pytest.raises(LockNotOwned):
        await api.release(lock)


async def test_release_after_another_holder_took_over_raises_lock_lost(api, backend, redis_client):
    lock = Lock("taken", backend=backend, timeout=0.2, auto_renew=False)
    other = Lock("taken", backend=backend, timeout=10, auto_renew=False)
    await api.acquire(lock)
    assert await api.acquire(other, blocking_timeout=5)
    assert lock.lost is True
    with pytest.raises(LockLost):
        await api.release(lock)
    # The failed release did not touch the new holder's lock.
    assert stored_lock(redis_client, "taken").token == other.token
    assert await api.owned(other)


async def test_ttl_reports_none_once_the_key_is_gone(api, backend, redis_client):
    lock = Lock("gone", backend=backend, auto_renew=False)
    await api.acquire(lock)
    redis_client.delete(lock_key("gone"))
    assert await api.ttl(lock) is None
    assert await api.owned(lock) is False
    assert lock.lost is True


# -- queries ----------------------------------------------------------------------------


async def test_locked_and_owned(api, backend):
    lock = Lock("query", backend=backend)
    other = Lock("query", backend=backend)
    assert await api.locked(lock) is False
    assert await api.owned(lock) is False
    await api.acquire(lock)
    assert await api.locked(lock) is True
    assert await api.owned(lock) is True
    assert await api.locked(other) is True
    assert await api.owned(other) is False
    await api.release(lock)
    assert await api.locked(lock) is False
    assert await api.owned(lock) is False


def test_owned_is_false_in_another_thread(backend):
    lock = Lock("query", backend=backend)
    with lock:
        assert in_other_thread(lock.owned) is False
        assert in_other_thread(lock.locked) is True
        assert in_other_thread(lambda: lock.fence) is None
        assert in_other_thread(lambda: lock.held) is False
        assert lock.owned() is True


# -- not re-entrant, tokens belong to a thread or task ----------------------------------


async def test_second_object_for_a_held_name_never_gets_it(api, backend):
    holder = Lock("solo", backend=backend, timeout=10)
    await api.acquire(holder)
    second = Lock("solo", backend=backend)
    assert await api.acquire(second, blocking=False) is False
    assert await api.acquire(second, blocking_timeout=0.2) is False
    assert await api.owned(holder)
    await api.release(holder)


async def test_same_object_acquired_twice_raises_lock_error(api, backend):
    lock = Lock("solo", backend=backend)
    await api.acquire(lock)
    fence = lock.fence
    with pytest.raises(LockError, match="reentrant=True") as caught:
        await api.acquire(lock)
    assert type(caught.value) is LockError
    with pytest.raises(LockError, match="reentrant=True"):
        async with api.hold(lock):
            pass
    # The first acquisition is untouched.
    assert lock.fence == fence
    assert await api.owned(lock)
    await api.release(lock)


def test_release_from_another_thread_raises_lock_not_owned(backend, redis_client):
    lock = Lock("mine", backend=backend)
    lock.acquire()
    with pytest.raises(LockNotOwned):
        in_other_thread(lock.release)
    with pytest.raises(LockNotOwned):
        in_other_thread(lock.extend, 1)
    assert in_other_thread(lock.ttl) is None
    assert stored_lock(redis_client, "mine").token == lock.token
    lock.release()


def test_same_object_in_another_thread_waits_like_anyone_else(backend, redis_client):
    lock = Lock("mine", backend=backend)
    lock.acquire()
    assert in_other_thread(lambda: lock.acquire(blocking=False)) is False
    assert lock.owned()

    def take_and_give_back():
        got = lock.acquire(blocking_timeout=5)
        fence = lock.fence
        lock.release()
        return got, fence

    first_fence = lock.fence
    thread_result = []
    thread = threading.Thread(target=lambda: thread_result.append(take_and_give_back()))
    thread.start()
    wait_until(lambda: blocked_clients(redis_client) == 1)
    lock.release()
    thread.join(timeout=10)
    assert len(thread_result) == 1
    assert thread_result[0][0] is True
    assert thread_result[0][1] > first_fence


async def test_release_from_another_task_raises_lock_not_owned(backend, redis_client):
    lock = Lock("mine", backend=backend)
    acquired = asyncio.Event()
    done = asyncio.Event()

    async def holder():
        await lock.aacquire()
        acquired.set()
        await done.wait()
        await lock.arelease()

    async def intruder():
        await acquired.wait()
        try:
            with pytest.raises(LockNotOwned):
                await lock.arelease()
            assert lock.token is None
            assert await lock.aowned() is False
            assert await lock.aacquire(blocking=False) is False
        finally:
            done.set()

    # Both tasks start from the same (empty) context, before anything is acquired.
    await asyncio.gather(holder(), intruder())
    assert redis_client.exists(lock_key("mine")) == 0


# -- the decorator ----------------------------------------------------------------------


def test_decorator_locks_each_call_under_its_formatted_name(backend, redis_client):
    seen = []

    @Lock("report:{day}:{kind}", backend=backend, blocking=False)
    def build_report(day, kind="full"):
        seen.append(stored_lock(redis_client, f"report:{day}:{kind}") is not None)
        # Not re-entrant, and another lock object for the same name cannot get it.
        assert not Lock(f"report:{day}:{kind}", backend=backend).acquire(blocking=False)
        # Another day is another lock.
        if day == 1:
            assert build_report(2) == "2/full"
        return f"{day}/{kind}"

    assert build_report(1) == "1/full"
    assert build_report(day=3, kind="short") == "3/short"
    assert seen == [True, True, True]
    assert build_report.__name__ == "build_report"
    assert keys_matching(redis_client, f"{PREFIX}{{report*}}") == []


def test_decorated_call_fails_when_its_lock_is_busy(backend):
    @Lock("job:{n}", backend=backend, blocking=False)
    def job(n):
        return n

    holder = Lock("job:1", backend=backend)
    holder.acquire()
    with pytest.raises(LockNotAcquired):
        job(1)
    assert job(2) == 2
    holder.release()


def test_decorator_template_with_attribute_access(backend, redis_client):
    @Lock("user:{user.pk}", backend=backend)
    def touch(user):
        return redis_client.exists(lock_key(f"user:{user.pk}"))

    assert touch(SimpleNamespace(pk=7)) == 1


def test_decorator_releases_when_the_function_raises(backend, redis_client):
    @Lock("fails:{n}", backend=backend)
    def fails(n):
        raise KeyError(n)

    with pytest.raises(KeyError):
        fails(5)
    assert redis_client.exists(lock_key("fails:5")) == 0


async def test_decorator_on_a_coroutine_function(backend, redis_client):
    @Lock("async-report:{day}", backend=backend, blocking=False)
    async def build_report(day):
        await asyncio.sleep(0)
        assert not await Lock(f"async-report:{day}", backend=backend).aacquire(blocking=False)
        return redis_client.exists(lock_key(f"async-report:{day}"))

    assert asyncio.iscoroutinefunction(build_report)
    assert await build_report(1) == 1
    results = await asyncio.gather(build_report(2), build_report(3))
    assert results == [1, 1]
    assert keys_matching(redis_client, f"{PREFIX}{{async-report*}}") == []


async def test_concurrent_decorated_calls_with_the_same_arguments_are_serialized(backend):
    active = []
    overlaps = []

    @Lock("serial:{n}", backend=backend, timeout=5)
    async def section(n):
        active.append(n)
        overlaps.append(len(active))
        await asyncio.sleep(0.01)
        active.remove(n)

    await asyncio.gather(*(section(1) for _ in range(5)))
    assert overlaps == [1] * 5


def test_decorator_template_naming_an_unknown_parameter_fails_at_decoration(dead_backend):
    lock = Lock("report:{month}", backend=dead_backend)
    with pytest.raises(ValueError, match="month"):

        @lock
        def build_report(day):
            pass

    with pytest.raises(ValueError, match="month"):

        @lock
        async def abuild_report(day):
            pass


def test_decorating_a_non_callable_raises_type_error(dead_backend):
    with pytest.raises(TypeError):
        Lock("x", backend=dead_backend)(42)


def test_decorator_rejects_a_formatted_name_that_is_invalid(dead_backend):
    called = []

    @Lock("job:{n}", backend=dead_backend)
    def job(n):
        called.append(n)

    with pytest.raises(ValueError, match="formatted lock name"):
        job("x" * MAX_NAME_LENGTH)
    with pytest.raises(ValueError, match="formatted lock name"):
        job("\x00")
    assert called == []


def test_renamed_copies_options_but_not_state(backend):
    lock = Lock("a", backend=backend, timeout=3, context="ctx", fair=True, blocking=False)
    lock.acquire()
    copy = lock.renamed("b")
    assert copy.name == "b"
    assert (copy.timeout, copy.context, copy.fair, copy.blocking) == (3, "ctx", True, False)
    assert copy.held is False
    assert copy.fence is None
    assert copy.acquire() is True
    assert copy.fence != lock.fence
    copy.release()
    assert lock.owned()
    with pytest.raises(ValueError, match="name"):
        lock.renamed("")
    lock.release()


# -- backends given as callables --------------------------------------------------------


async def test_backend_may_be_given_as_a_callable(api, backend, redis_client):
    calls = []

    def get_backend():
        calls.append(1)
        return backend

    lock = Lock("lazy", backend=get_backend)
    assert calls == []  # resolved at use, not at construction
    async with api.hold(lock):
        assert redis_client.exists(lock_key("lazy")) == 1
    assert calls


async def test_backend_callable_returning_something_else_raises_type_error(api):
    lock = Lock("lazy", backend=lambda: "redis://localhost")
    with pytest.raises(TypeError, match="Backend"):
        await api.acquire(lock)


def test_a_thread_name_that_cannot_be_stored_is_cleaned(backend, redis_client):
    # Thread and task names are anyone's strings: NUL, undecodable bytes, any length.
    lock = Lock("labels", backend=backend)

    def hold() -> dict:
        with lock:
            return stored_lock(redis_client, "labels").owner

    with ThreadPoolExecutor(1, thread_name_prefix="worker\x00-\udcff" + "t" * 300) as pool:
        owner = pool.submit(hold).result(timeout=30)
    assert owner["thread"] == "worker-" + "t" * 248


async def test_a_task_name_that_cannot_be_stored_is_cleaned(backend, redis_client):
    lock = Lock("labels", backend=backend)

    async def hold() -> dict:
        async with lock:
            return stored_lock(redis_client, "labels").owner

    owner = await asyncio.create_task(hold(), name="task\x00-\udcff" + "t" * 300)
    assert owner["thread"] == "task-" + "t" * 250


# -- bad input is refused before any network call ---------------------------------------


async def test_dead_backend_really_fails_on_the_network(api, dead_backend):
    # The premise of the tests below: a call that reached the network would raise this.
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(Lock("x", backend=dead_backend))


BAD_LOCK_ARGUMENTS = [
    ("name", None, TypeError),
    ("name", 42, TypeError),
    ("name", b"x", TypeError),
    ("name", "", ValueError),
    ("name", "x" * (MAX_NAME_LENGTH + 1), ValueError),
    ("name", EMOJI * (MAX_NAME_LENGTH + 1), ValueError),
    ("name", "a\x00b", ValueError),
    ("name", "lone\ud800", ValueError),
    ("timeout", 0, ValueError),
    ("timeout", -1, ValueError),
    ("timeout", math.nan, ValueError),
    ("timeout", math.inf, ValueError),
    ("timeout", True, TypeError),
    ("timeout", "30", TypeError),
    ("blocking_timeout", -1, ValueError),
    ("blocking_timeout", math.nan, ValueError),
    ("blocking_timeout", math.inf, ValueError),
    ("blocking_timeout", False, TypeError),
    ("blocking_timeout", "5", TypeError),
    ("blocking", 1, TypeError),
    ("blocking", "yes", TypeError),
    ("blocking", None, TypeError),
    ("auto_renew", 1, TypeError),
    ("auto_renew", "no", TypeError),
    ("on_lost", 1, TypeError),
    ("on_lost", "print", TypeError),
    ("context", 7, TypeError),
    ("context", "a\x00b", ValueError),
    ("context", "lone\ud800", ValueError),
    ("context", "x" * 256, ValueError),
    ("fair", 1, TypeError),
    ("raise_on_lost", None, TypeError),
    ("backend", "redis://localhost", TypeError),
    ("backend", 42, TypeError),
    ("backend", None, TypeError),
]


@pytest.mark.parametrize(
    ("argument", "value", "error"),
    BAD_LOCK_ARGUMENTS,
    ids=[f"{a}={v!r:.20}" for a, v, _ in BAD_LOCK_ARGUMENTS],
)
def test_bad_lock_arguments_are_rejected_naming_the_argument(dead_backend, argument, value, error):
    kwargs = {"name": "ok", "backend": dead_backend, argument: value}
    with pytest.raises(error, match=argument):
        Lock(**kwargs)


def test_backend_client_instead_of_backend_is_rejected(dead_backend):
    with pytest.raises(TypeError, match="backend"):
        Lock("ok", backend=redis.Redis())


BAD_ACQUIRE_ARGUMENTS = [
    ({"blocking": 1}, TypeError, "blocking"),
    ({"blocking": "no"}, TypeError, "blocking"),
    ({"blocking_timeout": -1}, ValueError, "blocking_timeout"),
    ({"blocking_timeout": math.nan}, ValueError, "blocking_timeout"),
    ({"blocking_timeout": math.inf}, ValueError, "blocking_timeout"),
    ({"blocking_timeout": True}, TypeError, "blocking_timeout"),
    ({"blocking_timeout": "1"}, TypeError, "blocking_timeout"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    BAD_ACQUIRE_ARGUMENTS,
    ids=[repr(k) for k, _, _ in BAD_ACQUIRE_ARGUMENTS],
)
async def test_bad_acquire_arguments_are_rejected_before_any_network_call(
    api, dead_backend, kwargs, error, argument
):
    lock = Lock("ok", backend=dead_backend)
    with pytest.raises(error, match=argument):
        await api.acquire(lock, **kwargs)


BAD_EXTEND_ARGUMENTS = [
    ((0,), {}, ValueError, "seconds"),
    ((-1,), {}, ValueError, "seconds"),
    ((math.nan,), {}, ValueError, "seconds"),
    ((math.inf,), {}, ValueError, "seconds"),
    ((True,), {}, TypeError, "seconds"),
    (("5",), {}, TypeError, "seconds"),
    ((None,), {}, TypeError, "seconds"),
    ((5,), {"replace_ttl": 1}, TypeError, "replace_ttl"),
    ((5,), {"replace_ttl": "yes"}, TypeError, "replace_ttl"),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "argument"),
    BAD_EXTEND_ARGUMENTS,
    ids=[f"{a!r}{k!r}" for a, k, _, _ in BAD_EXTEND_ARGUMENTS],
)
async def test_bad_extend_arguments_are_rejected_before_anything_else(
    api, dead_backend, args, kwargs, error, argument
):
    # Even before "you do not hold this lock", and without touching the network.
    lock = Lock("ok", backend=dead_backend)
    with pytest.raises(error, match=argument):
        await api.extend(lock, *args, **kwargs)


TOO_LONG = [MAX_SECONDS + 1, 1e16, 10**400]
TOO_LONG_IDS = ["max+1", "1e16", "10**400"]


@pytest.mark.parametrize("seconds", TOO_LONG, ids=TOO_LONG_IDS)
async def test_durations_beyond_max_seconds_are_refused_before_any_network_call(
    api, dead_backend, seconds
):
    # 1e16 used to reach Redis (and fail there after bumping the fence counter);
    # 10**400 raised OverflowError.
    for argument in ("timeout", "blocking_timeout"):
        with pytest.raises(ValueError, match=rf"^{argument} must be at most {MAX_SECONDS} "):
            Lock("ok", backend=dead_backend, **{argument: seconds})
    lock = Lock("ok", backend=dead_backend)
    with pytest.raises(ValueError, match=r"^blocking_timeout must be at most"):
        await api.acquire(lock, blocking_timeout=seconds)
    with pytest.raises(ValueError, match=r"^seconds must be at most"):
        await api.extend(lock, seconds)


async def test_the_longest_lease_and_wait_work_on_the_server(api, backend, redis_client):
    lock = Lock("long", backend=backend, timeout=MAX_SECONDS, blocking_timeout=MAX_SECONDS)
    await api.acquire(lock)
    lease_ms = MAX_SECONDS * 1000
    assert lease_ms - 5_000 < redis_client.pttl(lock_key("long")) <= lease_ms
    await api.extend(lock, MAX_SECONDS)
    assert 2 * lease_ms - 5_000 < redis_client.pttl(lock_key("long")) <= 2 * lease_ms
    assert 2 * MAX_SECONDS - 5 < await api.ttl(lock) <= 2 * MAX_SECONDS
    await api.release(lock)
    assert redis_client.exists(lock_key("long")) == 0


@pytest.mark.parametrize(
    "seconds",
    [0, -2, math.nan, True, 1e16, 10**400],
    ids=["0", "-2", "nan", "True", "1e16", "10**400"],
)
async def test_bad_extend_of_a_held_lock_changes_nothing(api, backend, redis_client, seconds):
    lock = Lock("held", backend=backend, timeout=10, auto_renew=False)
    await api.acquire(lock)
    pttl = redis_client.pttl(lock_key("held"))
    with pytest.raises((TypeError, ValueError), match="seconds"):
        await api.extend(lock, seconds)
    assert pttl - 500 < redis_client.pttl(lock_key("held")) <= pttl
    assert lock.held


# -- names round-trip through the real server -------------------------------------------

valid_names = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=MAX_NAME_LENGTH,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.one_of(valid_names, st.sampled_from(["{", "}", "%7B", EMOJI * 512, "index"])))
def test_valid_names_round_trip_through_the_server(redis_server, name):
    client = sync_client(redis_server.port)
    try:
        backend = Backend(client, prefix="roundtrip:")
        lock = Lock(name, backend=backend, auto_renew=False)
        assert lock.acquire(blocking=False) is True
        stored = stored_lock(client, name, "roundtrip:")
        assert stored.token == lock.token
        assert client.zscore(keys_of(name, "roundtrip:").index, name) == stored.lease_end_ms
        assert not Lock(name, backend=backend).acquire(blocking=False)
        lock.release()
        assert client.exists(lock_key(name, "roundtrip:")) == 0
        assert client.zscore(keys_of(name, "roundtrip:").index, name) is None
    finally:
        client.close()


invalid_names = st.one_of(
    st.text(max_size=10).map(lambda s: s + "\x00"),
    st.text(min_size=MAX_NAME_LENGTH + 1, max_size=MAX_NAME_LENGTH + 10),
    st.text(max_size=10).map(lambda s: "\udc80" + s),
    st.just(""),
    st.integers(),
    st.binary(max_size=10),
    st.none(),
)


@settings(max_examples=60, deadline=None)
@given(name=invalid_names)
def test_invalid_names_are_refused_before_any_network_call(name):
    backend = Backend(sync_client(1, socket_connect_timeout=0.5))
    with pytest.raises((TypeError, ValueError), match="name"):
        Lock(name, backend=backend)
    with pytest.raises((TypeError, ValueError), match="name"):
        Lock("ok", backend=backend).renamed(name)
