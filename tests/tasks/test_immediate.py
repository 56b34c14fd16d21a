"""Locked tasks run in process by the ``ImmediateBackend``: the lock around each run,
``on_busy``, the name bound to the signature, the context label, events and signals."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import override_settings

from django_distlock.engine import LockNotAcquired
from django_distlock.locks import distlock
from django_distlock.models import LockEvent
from django_distlock.signals import lock_acquired, lock_contended
from django_distlock.tasks import DEFERRED, SKIPPED, locked_task
from tests.support import locked_tasks
from tests.support.locked_tasks import task

pytestmark = pytest.mark.usefixtures("redis_client")


def immediate(locked):
    return locked.using(backend="default")


def test_a_run_holds_the_lock_and_gives_it_back(key):
    result = immediate(locked_tasks.skip_if_busy).enqueue(key, seconds=0)
    assert result.status == "SUCCESSFUL"
    run = result.return_value
    assert run["fence"] > 0
    # The held lock names the task and its result, for the admin, the CLI and events.
    assert run["context"] == f"tasks:tests.support.locked_tasks.skip_if_busy[{result.id}]"
    assert not distlock(f"skip:{key}").locked()


def test_a_task_taking_the_context_is_labelled_with_its_result(key):
    result = immediate(locked_tasks.wait_in_turn).enqueue(key, seconds=0)
    assert result.return_value["id"] == result.id
    assert result.return_value["context"].endswith(f"wait_in_turn[{result.id}]")


def test_skip_ends_the_run_with_skipped_and_the_same_lock_for_args_and_kwargs(key):
    with distlock(f"skip:{key}", timeout=30):
        by_position = immediate(locked_tasks.skip_if_busy).enqueue(key)
        by_keyword = immediate(locked_tasks.skip_if_busy).enqueue(key=key, seconds=0.02)
    assert by_position.status == by_keyword.status == "SUCCESSFUL"
    assert by_position.return_value == by_keyword.return_value == SKIPPED
    assert immediate(locked_tasks.skip_if_busy).enqueue(key).return_value != SKIPPED


@pytest.mark.django_db(transaction=True)
def test_a_skipped_run_is_a_contended_event_and_signal(key):
    seen = []

    def receive(sender, event, **kwargs):
        seen.append(event.kind)
        assert event.template == "skip:{key}"  # what metrics label it by

    lock_contended.connect(receive)
    lock_acquired.connect(receive)
    try:
        with override_settings(DISTLOCK={"EVENTS": "sync"}):
            with distlock(f"skip:{key}", timeout=30):
                assert immediate(locked_tasks.skip_if_busy).enqueue(key).return_value == SKIPPED
            ran = immediate(locked_tasks.skip_if_busy).enqueue(key, seconds=0)
    finally:
        lock_contended.disconnect(receive)
        lock_acquired.disconnect(receive)
    assert seen == ["acquired", "contended", "acquired"]
    kinds = list(
        LockEvent.objects.filter(name=f"skip:{key}").order_by("id").values_list("kind", "context")
    )
    assert [kind for kind, _ in kinds] == [
        "acquired",
        "contended",
        "released",
        "acquired",
        "released",
    ]
    assert kinds[-1][1] == f"tasks:tests.support.locked_tasks.skip_if_busy[{ran.id}]"


def test_wait_fails_with_lock_not_acquired_when_the_wait_runs_out(key):
    started = time.monotonic()
    with distlock(f"bounded:{key}", timeout=30):
        result = immediate(locked_tasks.wait_briefly).enqueue(key)
    assert 0.25 < time.monotonic() - started < 5
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is LockNotAcquired
    assert "still held after 0.3s" in result.errors[0].traceback


def test_wait_gets_the_lock_when_the_holder_lets_go(key):
    taken = threading.Event()

    def hold_briefly():
        with distlock(f"storm:{key}", timeout=30):
            taken.set()
            time.sleep(0.2)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    taken.wait(5)
    result = immediate(locked_tasks.wait_in_turn).enqueue(key, seconds=0)
    holder.join()
    assert result.status == "SUCCESSFUL"
    assert result.started_at is not None


def test_defer_fails_on_a_backend_that_cannot_put_a_task_off(key):
    with distlock(f"defer:{key}", timeout=30):
        result = immediate(locked_tasks.defer_if_busy).enqueue(key)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is LockNotAcquired


def test_a_failing_body_fails_the_result_and_releases_the_lock(key):
    with pytest.raises(TypeError):
        immediate(locked_tasks.skip_if_busy).call(key, seconds="no")
    result = immediate(locked_tasks.skip_if_busy).enqueue(key, seconds="no")
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is TypeError
    assert not distlock(f"skip:{key}").locked()


def test_a_direct_call_holds_the_lock_too(key):
    with distlock(f"skip:{key}", timeout=30):
        assert locked_tasks.skip_if_busy.call(key) == SKIPPED
    run = locked_tasks.skip_if_busy.call(key, seconds=0)
    assert run["context"] == "tasks:tests.support.locked_tasks.skip_if_busy"


def test_unique_while_queued_returns_the_running_result_in_process(key):
    task = immediate(locked_tasks.unique)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", task.enqueue(key, 0.5)))
    first.start()
    deadline = time.monotonic() + 5
    while not distlock(f"unique:{key}").locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = task.enqueue(key)
    first.join()
    assert second is results["first"]
    assert second.status == "SUCCESSFUL"
    # Once the run ended, the name is free again.
    third = task.enqueue(key, 0)
    assert third.id != second.id


def test_an_async_task_holds_the_lock_in_the_task_running_it(key):
    task = immediate(locked_tasks.async_skip_if_busy)
    result = task.enqueue(key, seconds=0)
    assert result.status == "SUCCESSFUL"
    label = f"tasks:tests.support.locked_tasks.async_skip_if_busy[{result.id}]"
    assert result.return_value["context"] == label
    assert not distlock(f"async:{key}").locked()
    with distlock(f"async:{key}", timeout=30):
        assert task.enqueue(key).return_value == SKIPPED
    failed = task.enqueue(key, seconds="no")
    assert failed.errors[0].exception_class is TypeError
    assert not distlock(f"async:{key}").locked()


async def test_an_async_task_runs_from_async_code_too(key):
    task = immediate(locked_tasks.async_skip_if_busy)
    result = await task.aenqueue(key, seconds=0)
    assert result.return_value["fence"] > 0
    assert await locked_tasks.async_skip_if_busy.acall(key, seconds=0) is not None


def test_the_locked_task_is_a_task_of_the_same_class():
    plain = locked_tasks.unlocked
    locked = locked_tasks.locked
    assert isinstance(locked, type(plain))
    assert locked.module_path == "tests.support.locked_tasks.locked"
    assert locked.using(priority=3).func is locked.func
    assert locked.name == "locked"


def test_misuse_fails_where_the_task_is_defined():
    def body(account_id): ...

    with pytest.raises(TypeError, match="above @task"):
        locked_task("import:{account_id}", on_busy="skip")(body)
    with pytest.raises(ValueError, match="has no parameter 'acount_id'"):
        locked_task("import:{acount_id}", on_busy="skip")(locked_tasks.unlocked)
    with pytest.raises(ValueError, match="on_busy must be one of"):
        locked_task("x", on_busy="retry")(locked_tasks.unlocked)
    for template in ("x:{key!z}", "x:{key:>{key!q}}", "x:{key:{key:{key}}}"):
        with pytest.raises(ValueError, match="is not a valid template"):
            locked_task(template, on_busy="skip")(locked_tasks.unlocked)
    with pytest.raises(TypeError, match="locked already"):
        locked_task("x", on_busy="wait")(locked_tasks.locked)
    with pytest.raises(ValueError, match="blocking_timeout"):
        locked_task("x", on_busy="wait", blocking_timeout=-1)(locked_tasks.unlocked)
    assert DEFERRED != SKIPPED
    assert task is not None
