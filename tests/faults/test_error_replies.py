"""Error replies from Redis (issue 9, item 8): a server that answers with an error (here
its ACL refuses scripts) is reachable, so the caller must get a ``LockError`` that is not
``LockBackendUnavailable`` (which says "could not reach Redis, try again")."""

from __future__ import annotations

import pytest

from django_distlock.engine import Lock, LockBackendUnavailable, LockError

USER = {"username": "locker", "password": "locker-pw"}
FAST = {"socket_timeout": 1, "socket_connect_timeout": 1}


def allow_scripts(server, allowed: bool) -> None:
    """(Re)define the user the backend logs in as: everything allowed, scripts only if
    ``allowed``. ACL changes apply to open connections at once."""
    scripts = "+" if allowed else "-"
    with server.client() as admin:
        admin.acl_setuser(
            USER["username"],
            enabled=True,
            passwords=[f"+{USER['password']}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", f"{scripts}eval", f"{scripts}evalsha"],
            reset=True,
        )


def assert_error_reply(error: BaseException) -> None:
    assert isinstance(error, LockError)
    assert not isinstance(error, LockBackendUnavailable), repr(error)


@pytest.mark.parametrize("blocking", [False, True], ids=["non-blocking", "blocking"])
async def test_a_refused_acquire_is_a_lock_error_not_unavailable(
    api, private_redis, make_backend, blocking
):
    allow_scripts(private_redis, allowed=False)
    backend = make_backend(private_redis, client_kwargs={**USER, **FAST})
    lock = Lock("refused", backend=backend)
    with pytest.raises(LockError) as caught:
        await api.acquire(lock, blocking=blocking, blocking_timeout=1)
    assert_error_reply(caught.value)
    assert lock.held is False


async def test_a_refused_release_is_a_lock_error_not_unavailable(api, private_redis, make_backend):
    allow_scripts(private_redis, allowed=True)
    backend = make_backend(private_redis, client_kwargs={**USER, **FAST})
    lock = Lock("refused", backend=backend, timeout=30, auto_renew=False)
    assert await api.acquire(lock, blocking=False)
    allow_scripts(private_redis, allowed=False)
    with pytest.raises(LockError) as caught:
        await api.release(lock)
    assert_error_reply(caught.value)
