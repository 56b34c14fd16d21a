"""Who holds an acquisition: the thread that called ``acquire()`` or the task that called
``aacquire()``, whatever task the coroutine ends up running in; never a task created
inside the held block; and a hold whose owner ended without releasing it is released
by the watchdog and reported lost."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading

import pytest

from django_distlock.engine import Lock, LockLost, LockNotOwned
from tests.support.engine import await_until, lock_key, stored_lock


async def assert_caller_holds(lock, redis_client):
    assert lock.held is True
    stored = stored_lock(redis_client, lock.name)
    assert (stored.token, stored.fence) == (lock.token, lock.fence)
    await lock.arelease()
    assert redis_client.exists(lock_key(lock.name)) == 0
    assert lock.held is False
    assert lock.fence is None


async def test_wait_for_around_aacquire_gives_the_lock_to_the_caller(backend, redis_client):
    """On Python 3.11 ``wait_for`` runs the coroutine in a task of its own."""
    lock = Lock("wrapped", backend=backend)
    assert await asyncio.wait_for(lock.aacquire(), 5) is True
    await assert_caller_holds(lock, redis_client)


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda c: asyncio.gather(c), id="gather"),
        pytest.param(asyncio.shield, id="shield"),
        pytest.param(asyncio.ensure_future, id="create_task"),
    ],
)
async def test_tasks_around_aacquire_give_the_lock_to_the_caller(wrap, backend, redis_client):
    lock = Lock("wrapped", backend=backend)
    result = await wrap(lock.aacquire())
    assert result in (True, [True])
    await assert_caller_holds(lock, redis_client)


async def test_wait_for_around_the_other_async_methods_acts_for_the_caller(backend, redis_client):
    lock = Lock("wrapped", backend=backend, auto_renew=False)
    await lock.aacquire()
    assert await asyncio.wait_for(lock.attl(), 5) > 0
    assert await asyncio.wait_for(lock.aowned(), 5) is True
    await asyncio.wait_for(lock.aextend(5), 5)
    await asyncio.wait_for(lock.areacquire(), 5)
    await asyncio.wait_for(lock.arelease(), 5)
    assert redis_client.exists(lock_key("wrapped")) == 0


async def test_a_task_created_inside_the_block_does_not_hold_it(backend, redis_client):
    lock = Lock("parent", backend=backend)
    seen = {}

    async def child():
        seen["held"] = lock.held
        seen["fence"] = lock.fence
        seen["token"] = lock.token
        with pytest.raises(LockNotOwned):
            await lock.arelease()
        with pytest.raises(LockNotOwned):
            await lock.aextend(1)
        seen["ttl"] = await lock.attl()

    async with lock:
        token = lock.token
        await asyncio.create_task(child())
        # The parent's hold is untouched, in Redis and locally.
        assert stored_lock(redis_client, "parent").token == token
        assert lock.held is True
    assert seen == {"held": False, "fence": None, "token": None, "ttl": None}
    assert redis_client.exists(lock_key("parent")) == 0


async def test_another_thread_does_not_see_a_tasks_hold(backend):
    lock = Lock("mine", backend=backend)
    async with lock:
        seen = await asyncio.to_thread(lambda: (lock.held, lock.fence))
        assert seen == (False, None)


async def test_a_task_that_ends_without_releasing_loses_its_hold(
    backend, redis_client, recorder, caplog
):
    """Its watchdog releases it instead of renewing it for ever."""
    backend.observer = recorder
    lock = Lock("forgotten", backend=backend, timeout=0.6)

    async def take_and_leave():
        await lock.aacquire()
        return lock.token

    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        task = asyncio.create_task(take_and_leave(), name="careless-task")
        token = await task
        assert stored_lock(redis_client, "forgotten").token == token
        await await_until(lambda: redis_client.exists(lock_key("forgotten")) == 0, within=3)
        event = await recorder.await_for("lost", within=3)
    assert event is not None
    assert "careless-task" in event.reason
    assert "ended without releasing" in event.reason
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("'forgotten'" in m and "careless-task" in m for m in messages), messages


async def test_a_thread_that_ends_without_releasing_loses_its_hold(
    backend, redis_client, recorder, caplog
):
    backend.observer = recorder
    lock = Lock("forgotten", backend=backend, timeout=0.6)
    thread = threading.Thread(target=lock.acquire, name="careless-thread")
    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        thread.start()
        thread.join()
        assert redis_client.exists(lock_key("forgotten")) == 1
        await await_until(lambda: redis_client.exists(lock_key("forgotten")) == 0, within=3)
        event = await recorder.await_for("lost", within=3)
    assert event is not None
    assert "careless-thread" in event.reason
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("'forgotten'" in m and "careless-thread" in m for m in messages), messages


async def test_a_lock_object_dropped_while_held_is_released(backend, redis_client, caplog):
    lock = Lock("dropped", backend=backend, timeout=0.6)
    lock.acquire()
    del lock
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        await await_until(lambda: redis_client.exists(lock_key("dropped")) == 0, within=3)
        await await_until(
            lambda: any("garbage-collected" in r.getMessage() for r in caplog.records)
        )
    [message] = [r.getMessage() for r in caplog.records if "garbage-collected" in r.getMessage()]
    assert "'dropped'" in message


async def test_lost_and_its_reason_outlive_the_block_until_the_next_acquire(
    api, backend, redis_client
):
    lock = Lock("taken-over", backend=backend, timeout=5, auto_renew=False)
    with pytest.raises(LockLost):
        async with api.hold(lock):
            redis_client.delete(lock_key("taken-over"))
    # What an ``except LockLost`` handler sees:
    assert lock.lost is True
    assert "another holder" in lock.lost_reason
    assert lock.fence is None
    assert lock.token is None
    assert lock.held is False
    await api.acquire(lock)
    assert lock.lost is False
    assert lock.lost_reason == ""
    await api.release(lock)
    assert lock.lost is False


async def test_a_clean_release_is_not_lost(api, backend):
    lock = Lock("clean", backend=backend)
    async with api.hold(lock):
        pass
    assert lock.lost is False
    assert lock.lost_reason == ""
    assert lock.fence is None


async def test_wait_for_runs_aacquire_in_a_task_of_its_own_before_python_3_12_only(backend):
    """Guards the first test: on Python 3.11 ``wait_for`` runs the coroutine in a task of
    its own, the case that test is for; from 3.12 it runs it inline, and
    ``test_tasks_around_aacquire_give_the_lock_to_the_caller`` covers a task of its own."""
    lock = Lock("probe", backend=backend)
    caller = asyncio.current_task()
    seen = []
    original = lock._aacquire

    async def spy(*args):
        seen.append(asyncio.current_task())
        return await original(*args)

    lock._aacquire = spy
    await asyncio.wait_for(lock.aacquire(), 5)
    assert len(seen) == 1
    assert (seen[0] is not caller) is (sys.version_info < (3, 12))
    await lock.arelease()
