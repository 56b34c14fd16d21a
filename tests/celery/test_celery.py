"""``locked_task`` and ``LockedTask`` in this process: how tasks are defined and checked,
what a run does (``task.apply()`` runs it here, as a worker would), and what
``unique_while_queued`` does when a task is published (to the suite's Redis, with no
worker taking it). Real workers: ``test_workers.py`` and ``test_redelivery.py``."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
from celery import Celery, Task, current_task
from celery.app.task import Context
from celery.signals import task_revoked

import django_distlock.celery
from django_distlock import LockLost, LockNotAcquired, distlock
from django_distlock.celery import LockedTask, locked_task
from django_distlock.engine import LockKeys
from django_distlock.models import HeldLock
from tests.support import REPO_ROOT
from tests.support.celery_app import app
from tests.support.events import events_mode, kinds

seen: list[dict[str, Any]] = []


@app.task(bind=True)
@locked_task("inproc:{account_id}", on_busy="skip")
def bound(self: Task, account_id: int, mode: str = "full") -> int:
    lock = self.request.distlock
    seen.append({"fence": lock.fence, "context": lock.context, "name": lock.name})
    return account_id


@app.task
@locked_task("inproc:{account_id}", on_busy="retry", max_retry_countdown=0.1)
def unbound(account_id: int) -> int:
    seen.append({"fence": current_task.request.distlock.fence})
    return account_id


# On an app of its own, and not shared (app.task shares a task with every app finalized
# later): the suite's apps must pass the checks (E007: test_task_classes.py).
misconfigured = Celery("misconfigured", set_as_current=False)


@misconfigured.task(shared=False)
@locked_task("inproc:{account_id}", on_busy="skip", unique_while_queued=True)
def unique_without_base(account_id: int) -> int:
    return account_id


@app.task(base=LockedTask)
@locked_task("inproc-unique:{account_id}", on_busy="skip", unique_while_queued=True)
def unique(account_id: int) -> int:
    return account_id


@app.task(base=LockedTask, lock_name="inproc:{account_id}", lock_on_busy="skip")
def by_attributes(account_id: int) -> int:
    return account_id


@pytest.fixture(autouse=True)
def _fresh(redis_client, celery_dbs):
    seen.clear()


def lock_key(name: str) -> str:
    return LockKeys.for_name("distlock:", name).lock


# -- defining tasks -----------------------------------------------------------------------


def test_importing_django_distlock_does_not_import_celery():
    code = "import sys, django_distlock; assert 'celery' not in sys.modules, sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_the_public_names_are_documented():
    assert django_distlock.celery.__all__ == ["LockedTask", "locked_task"]
    for name in django_distlock.celery.__all__:
        assert getattr(django_distlock.celery, name).__doc__, name


def test_an_app_whose_tasks_are_all_locked_tasks(redis_client):
    """``task_cls=LockedTask``: the decorator alone gets unique_while_queued, and a task
    without a lock is a plain one."""
    other = Celery("other", task_cls="django_distlock.celery:LockedTask", set_as_current=False)
    other.conf.broker_url = app.conf.broker_url

    @other.task(shared=False)
    @locked_task("inproc-unique:{account_id}", on_busy="skip", unique_while_queued=True)
    def imported(account_id):
        return account_id

    @other.task(shared=False)
    def plain(account_id):
        return getattr(current_task.request, "distlock", None)

    assert isinstance(imported, LockedTask)
    first = imported.delay(19)
    assert imported.delay(19).id == first.id
    assert claim(redis_client, "inproc-unique:19") == f"q:{first.id}".encode()
    assert plain.apply((19,)).get() is None


def test_a_template_field_that_is_no_parameter_fails_at_decoration():
    with pytest.raises(ValueError, match=r"uses \{acount_id\} but .*sync\(\) has no parameter"):

        @locked_task("import:{acount_id}", on_busy="skip")
        def sync(account_id): ...


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"on_busy": "later"}, ValueError, "on_busy must be one of 'skip', 'retry', 'wait'"),
        ({"on_busy": "skip", "blocking_timeout": -1}, ValueError, "blocking_timeout"),
        ({"on_busy": "skip", "timeout": 0}, ValueError, "timeout must be positive"),
        ({"on_busy": "retry", "max_retry_countdown": "1"}, TypeError, "max_retry_countdown"),
        ({"on_busy": "skip", "unique_while_queued": 1}, TypeError, "unique_while_queued"),
        ({"on_busy": "skip", "unique_timeout": float("inf")}, ValueError, "unique_timeout"),
    ],
)
def test_bad_options_fail_at_decoration(options, error, message):
    with pytest.raises(error, match=message):
        locked_task("import", **options)(lambda: None)


@pytest.mark.parametrize("template", ["x:{a!z}", "x:{a:>{w!q}}", "x:{a:{w:{a}}}"])
def test_a_template_str_format_would_refuse_fails_at_definition(template):
    with pytest.raises(ValueError, match="is not a valid template"):
        locked_task(template, on_busy="skip")(lambda a, w=1: None)
    with pytest.raises(ValueError, match="is not a valid template"):

        class Converted(LockedTask):
            lock_name = template
            lock_on_busy = "skip"

            def run(self, a, w=1): ...


def test_on_busy_must_be_said():
    with pytest.raises(TypeError, match="on_busy"):
        locked_task("import")  # type: ignore[call-arg]


def test_a_bad_constant_name_fails_at_decoration():
    with pytest.raises(ValueError, match="NUL"):
        locked_task("import\x00", on_busy="skip")(lambda: None)


def test_locked_task_goes_under_the_task_decorator():
    with pytest.raises(TypeError, match=r"under @app\.task"):
        locked_task("import", on_busy="skip")(bound)


def test_async_functions_are_refused():
    async def sync(): ...

    with pytest.raises(TypeError, match="async def"):
        locked_task("import", on_busy="skip")(sync)


def test_celery_still_checks_the_arguments_of_delay():
    with pytest.raises(TypeError, match="account_id"):
        unbound.delay()  # refused before anything is published


def test_lock_attributes_are_checked_when_the_class_is_created():
    with pytest.raises(ValueError, match=r"uses \{account\} but .*run\(\) has no parameter"):

        class Misnamed(LockedTask):
            lock_name = "import:{account}"
            lock_on_busy = "skip"

            def run(self, account_id): ...

    with pytest.raises(ValueError, match="lock_on_busy must be one of"):

        class Undecided(LockedTask):
            lock_name = "import:{account_id}"

            def run(self, account_id): ...


def test_a_lock_is_configured_in_one_place():
    with pytest.raises(TypeError, match="configure the lock in one place"):

        class Twice(LockedTask):
            lock_name = "import:{account_id}"
            lock_on_busy = "skip"
            run = locked_task("import:{account_id}", on_busy="skip")(lambda self, account_id: 1)


def test_a_subclass_locks_its_own_name():
    class Parent(LockedTask):
        name = "tests.celery.parent"
        lock_name = "parent:{account_id}"
        lock_on_busy = "skip"

        def run(self, account_id):
            return self.request.distlock.name

    class Child(Parent):
        name = "tests.celery.child"
        lock_name = "child:{account_id}"

    class Unlocked(Parent):
        name = "tests.celery.unlocked"
        lock_name = None

        def run(self, account_id):
            return getattr(self.request, "distlock", None)

    class Inherited(Parent):
        name = "tests.celery.inherited"
        lock_name = None

    parent, child, unlocked, inherited = (
        app.register_task(cls()) for cls in (Parent, Child, Unlocked, Inherited)
    )
    assert parent.apply((1,)).get() == "parent:1"
    assert child.apply((1,)).get() == "child:1"
    assert unlocked.apply((1,)).get() is None  # no lock configured: a plain task
    assert isinstance(inherited.apply((1,)).result, AttributeError)  # its run is not locked


def test_autoretry_for_keeps_the_task_in_charge():
    """Celery's ``autoretry_for`` wraps ``run`` on the task: the run still knows its task
    (its id in the context label, its retry)."""

    @app.task(bind=True, autoretry_for=(KeyError,))
    @locked_task("inproc:{account_id}", on_busy="skip")
    def flaky(self, account_id):
        return self.request.distlock.context

    result = flaky.apply((2,))
    assert result.get() == f"celery:tests.celery.test_celery.flaky[{result.id}]"


# -- running them ---------------------------------------------------------------------------


def test_the_body_runs_holding_the_lock_named_after_its_arguments(redis_client):
    result = bound.apply((7,))
    assert result.get() == 7
    [run] = seen
    assert run["name"] == "inproc:7"
    assert run["context"] == f"celery:tests.celery.test_celery.bound[{result.id}]"
    assert run["fence"] > 0
    assert not redis_client.exists(lock_key("inproc:7"))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((7,), {}), ((), {"account_id": 7}), ((7, "full"), {}), ((7,), {"mode": "full"})],
)
def test_positional_keyword_and_default_arguments_take_one_lock(args, kwargs):
    with distlock("inproc:7"):
        value = bound.apply(args, kwargs).get()
    assert value["lock"] == "inproc:7"


@pytest.mark.django_db
def test_a_skipped_run_returns_its_reason_logs_it_and_records_contention(caplog):
    caplog.set_level(logging.INFO, logger="django_distlock.celery")
    with events_mode("sync"), distlock("inproc:8", context="elsewhere"):
        result = by_attributes.apply((8,))
    assert result.state == "SUCCESS"
    value = result.get()
    assert value["distlock"] == "skipped"
    assert value["lock"] == "inproc:8"
    assert 25 < value["retry_after"] <= 30
    assert kinds("inproc:8") == ["acquired", "contended", "released"]
    [message] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert message.startswith(
        f"tests.celery.test_celery.by_attributes[{result.id}] skipped: lock 'inproc:8' is held by "
    )
    assert " since " in message


def test_retry_outside_a_worker_fails_with_lock_not_acquired():
    with distlock("inproc:9"), pytest.raises(LockNotAcquired, match="'inproc:9'"):
        unbound(9)  # called directly: Celery's retry() raises the error itself


def test_a_direct_call_runs_under_the_lock_too(redis_client):
    assert unbound(10) == 10
    assert seen[0]["fence"] > 0
    assert not redis_client.exists(lock_key("inproc:10"))


def test_a_lock_lost_while_the_task_ran_fails_it(redis_client):
    @app.task(bind=True)
    @locked_task("inproc:{account_id}", on_busy="skip")
    def evicted(self, account_id):
        HeldLock.objects.get(name=f"inproc:{account_id}").release(force=True)

    result = evicted.apply((11,))
    assert result.state == "FAILURE"
    assert isinstance(result.result, LockLost)


def test_unique_while_queued_needs_the_locked_task_base():
    result = unique_without_base.apply((12,))
    assert result.state == "FAILURE"
    assert isinstance(result.result, TypeError)
    assert "@app.task(base=LockedTask)" in str(result.result)


# -- publishing with unique_while_queued --------------------------------------------------


def claim(redis_client, name: str) -> bytes | None:
    return redis_client.get(LockKeys.for_name("distlock:", name).beside("celery-claim"))


def test_a_second_publish_returns_the_queued_tasks_result(redis_client, caplog):
    caplog.set_level(logging.INFO, logger="django_distlock.celery")
    first = unique.delay(13)
    second = unique.apply_async((13,), task_id="mine")
    assert second.id == first.id
    assert claim(redis_client, "inproc-unique:13") == f"q:{first.id}".encode()
    assert f"[mine] not published: tests.celery.test_celery.unique[{first.id}]" in caplog.text
    assert unique.delay(14).id != first.id


def test_the_claim_lasts_through_a_countdown(redis_client):
    unique.apply_async((15,), countdown=100)
    ttl = redis_client.pttl(
        LockKeys.for_name("distlock:", "inproc-unique:15").beside("celery-claim")
    )
    assert 3_699_000 < ttl <= 3_700_000


def test_a_publish_that_fails_gives_the_claim_back(redis_client, monkeypatch):
    def broken(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(Task, "apply_async", broken)
    with pytest.raises(ConnectionError):
        unique.delay(16)
    assert claim(redis_client, "inproc-unique:16") is None


def test_a_message_a_worker_discards_gives_its_claim_back(redis_client):
    first = unique.delay(18)
    other = unique.AsyncResult("someone-else")
    for result in (other, first):  # a stale revoke of another id leaves the claim alone
        assert claim(redis_client, "inproc-unique:18") == f"q:{first.id}".encode()
        task_revoked.send(sender=unique, request=Context(id=result.id, args=[18], kwargs={}))
    assert claim(redis_client, "inproc-unique:18") is None


def test_a_run_that_already_ran_is_dropped(redis_client):
    result = unique.apply((17,))
    assert result.get() == 17
    assert unique.apply((17,), task_id=result.id).state == "IGNORED"
    assert claim(redis_client, "inproc-unique:17") is None
