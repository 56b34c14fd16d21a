"""``BesideLock``, the engine's extension point: keys beside a lock, in its slot and
under the prefix, and the scripts and commands run on them (on every topology)."""

from __future__ import annotations

import pytest
import redis

from django_distlock.engine import Backend, BesideLock, Lock, LockBackendUnavailable, Script
from tests.support.engine import keys_of, lock_key

NAME = "import:7"

# Sets KEYS[1] to ARGV[1] and answers whether the lock (KEYS[2]) exists.
SET_BESIDE = Script(
    "test_set_beside",
    r"""
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('EXISTS', KEYS[2])
""",
)


def test_a_script_runs_on_keys_beside_the_lock_with_the_locks_own_key(
    backend: Backend, redis_client: redis.Redis
) -> None:
    beside = BesideLock(backend, NAME)
    note = beside.key("myapp-note")
    assert beside.lock == lock_key(NAME)
    assert note == keys_of(NAME).beside("myapp-note")
    assert beside.run(SET_BESIDE, (note, beside.lock), ("free",)) == 0
    with Lock(NAME, backend=backend):
        assert beside.run(SET_BESIDE, (note, beside.lock), ("held",)) == 1
    assert redis_client.get(note) == b"held"
    assert beside.execute(note, "GET", note) == b"held"


def test_the_holder_is_read_from_the_locks_key(backend: Backend) -> None:
    beside = BesideLock(backend, NAME)
    assert beside.holder() is None
    with Lock(NAME, backend=backend, context="job[42]") as lock:
        holder = beside.holder()
        assert holder is not None
        assert (holder.fence, holder.context) == (lock.fence, "job[42]")
    assert beside.holder() is None


def test_only_the_locks_key_and_keys_it_named_are_accepted(dead_backend: Backend) -> None:
    beside = BesideLock(dead_backend, NAME)
    named = beside.key("myapp-note")
    elsewhere = BesideLock(dead_backend, "other").key("myapp-note")
    for keys in [(elsewhere,), (named, "unprefixed"), ()]:
        with pytest.raises(ValueError, match="keys beside lock 'import:7'"):
            beside.run(SET_BESIDE, keys)
    with pytest.raises(ValueError, match="keys beside lock"):
        beside.execute("unprefixed", "SET", "unprefixed", 1)
    with pytest.raises(ValueError, match="cannot name a kind of key"):
        beside.key("fence")
    # Its own keys get as far as the network (nothing listens on the dead backend).
    with pytest.raises(LockBackendUnavailable):
        beside.run(SET_BESIDE, (named, beside.lock), ("x",))
