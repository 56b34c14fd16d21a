"""Fork safety (issue 9, item 2): a child forked from a process that holds locks (gunicorn
``--preload``, Celery prefork) shares its Backend object but must share neither its
holds nor its connections."""

from __future__ import annotations

import contextlib
import time

from django_distlock.engine import Lock, LockError, LockNotOwned
from tests.support.engine import Recorder, lock_key, wait_until
from tests.support.proxy import sends_command

LEASE = 1.5


def stored_token(client, name: str) -> str | None:
    """The token of whoever holds ``name`` according to Redis (the lock key's value
    starts with ``token\\n``)."""
    value = client.get(lock_key(name))
    return None if value is None else value.decode().split("\n", 1)[0]


def test_a_child_renewing_on_the_parents_backend_gets_its_own_replies(
    make_backend, private_redis, make_proxy, fork
):
    """Parent and child renew on one Backend object. Each must read the answers to its
    own renewals: the child's locks are gone from Redis and must be reported lost there;
    the parent's are renewed and must stay held.

    Scripts take 5 ms to reach the server (a cross-zone network), so that the parent's
    and the child's rounds of renewals overlap in time, as they do with more locks."""
    proxy = make_proxy(private_redis)
    proxy.delay_client_data(sends_command("EVALSHA"), 0.005)
    recorder = Recorder()
    backend = make_backend(port=proxy.port, observer=recorder)
    parent_locks = [Lock(f"parent:{i}", backend=backend, timeout=LEASE) for i in range(50)]
    for lock in parent_locks:
        assert lock.acquire(blocking=False)
    try:
        check_parent_and_child(private_redis, backend, recorder, parent_locks, fork)
    finally:
        for lock in parent_locks:
            with contextlib.suppress(LockError):
                lock.release()


def check_parent_and_child(private_redis, backend, recorder, parent_locks, fork) -> None:
    time.sleep(LEASE / 3 + 0.2)  # a renewal round ran: the parent's connections are open

    def child() -> dict[str, object]:
        lost: list[str] = []
        locks = [
            Lock(
                f"child:{i}",
                backend=backend,
                timeout=LEASE,
                on_lost=lambda lock: lost.append(lock.name),
            )
            for i in range(20)
        ]
        for lock in locks:
            assert lock.acquire(blocking=False)
        time.sleep(3 * LEASE)
        return {
            "on_lost": sorted(lost),
            "lost": sorted(lock.name for lock in locks if lock.lost),
        }

    running = fork(child)
    with private_redis.client() as probe:
        child_keys = [lock_key(f"child:{i}") for i in range(20)]
        wait_until(lambda: probe.exists(*child_keys) == 20)
        probe.delete(*child_keys)  # the child's renewals will find them gone
        in_child = running.result(timeout=15)

        lost_in_parent = [lock.name for lock in parent_locks if lock.lost]
        reasons = sorted({event.reason for event in recorder.of("lost")})[:3]
        assert lost_in_parent == [], f"the parent lost locks it renewed, e.g. because {reasons}"
        stolen = [
            lock.name for lock in parent_locks if stored_token(probe, lock.name) != lock.token
        ]
        assert stolen == [], "the parent's locks were not renewed"
    every_child_lock = sorted(f"child:{i}" for i in range(20))
    assert in_child == {"on_lost": every_child_lock, "lost": every_child_lock}, (
        "the child was not told its locks were lost"
    )


def test_a_child_inherits_none_of_its_parents_holds(make_backend, private_redis, fork):
    backend = make_backend(private_redis)
    lock = Lock("parent", backend=backend, timeout=5)
    assert lock.acquire(blocking=False)
    with private_redis.client() as probe:
        stored = probe.get(lock_key("parent"))

        def child() -> dict[str, object]:
            seen: dict[str, object] = {"held": lock.held, "fence": lock.fence, "token": lock.token}
            try:
                lock.release()
                seen["release"] = "released"
            except LockNotOwned as exc:
                seen["release"] = type(exc).__name__
            own = Lock("child-own", backend=backend, timeout=5)
            seen["own acquired"] = own.acquire(blocking=False)
            if seen["own acquired"]:
                own.release()
            return seen

        seen = fork(child).result(timeout=10)
        assert seen == {
            "held": False,
            "fence": None,
            "token": None,
            "release": "LockNotOwned",
            "own acquired": True,
        }
        assert probe.get(lock_key("parent")) == stored, "the child touched the parent's lock"
        assert probe.exists(lock_key("child-own")) == 0
    assert lock.held
    lock.release()
