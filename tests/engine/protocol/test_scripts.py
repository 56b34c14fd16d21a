"""The Lua scripts, run directly against the server."""

from __future__ import annotations

import hashlib
import re

import pytest
import redis
from redis.cluster import RedisCluster

from django_distlock.engine import LockKeys
from django_distlock.engine.listing.scripts import LIST_BUCKETS, LIST_INDEX, LIST_WINDOW
from django_distlock.engine.protocol.scripts import (
    ACQUIRE,
    EXTEND,
    EXTEND_MANY,
    HOLDER_ACQUIRE,
    HOLDER_EXTEND,
    HOLDER_RELEASE,
    HOLDER_TTL,
    MANY_ACQUIRE,
    PASS_ON,
    RELEASE,
    TTL,
    WAKE,
)
from tests.support.engine import server_time_us
from tests.support.probe import single_server_only

SCRIPTS = [
    ACQUIRE,
    RELEASE,
    EXTEND,
    EXTEND_MANY,
    TTL,
    PASS_ON,
    WAKE,
    LIST_INDEX,
    LIST_BUCKETS,
    LIST_WINDOW,
    HOLDER_ACQUIRE,
    HOLDER_RELEASE,
    HOLDER_EXTEND,
    HOLDER_TTL,
    MANY_ACQUIRE,
]
KEYS = LockKeys.for_name("distlock:", "raw")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_every_script_documents_its_keys_arguments_and_reply(script):
    assert script.source.startswith(f"-- {script.name}:")
    assert "KEYS[1]" in script.source
    assert "ARGV[1]" in script.source
    assert "-- returns" in script.source


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_sha_is_that_of_the_source(script, redis_client):
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
    assert redis_client.script_load(script.source) == script.sha


def hold(redis_client, token: str, px: int) -> None:
    redis_client.set(KEYS.lock, f"{token}\n1\n1\n{px}\n{{}}", px=px)


def extend(redis_client, token: str, ms: int, mode: str) -> int:
    return redis_client.eval(EXTEND.source, 2, KEYS.lock, KEYS.index, token, ms, "raw", mode)


def test_extend_modes(redis_client):
    hold(redis_client, "tok", 5_000)
    assert 7_900 < extend(redis_client, "tok", 3_000, "add") <= 8_000
    assert extend(redis_client, "tok", 1_000, "set") == 1_000
    assert 0 < redis_client.pttl(KEYS.lock) <= 1_000
    # 'renew' raises a shorter lease to the full one...
    assert extend(redis_client, "tok", 2_000, "renew") == 2_000
    # ...and never shortens a longer one.
    hold(redis_client, "tok", 9_000)
    before_ms = server_time_us(redis_client) // 1000
    new_ms = extend(redis_client, "tok", 2_000, "renew")
    after_ms = server_time_us(redis_client) // 1000
    assert 8_900 < new_ms <= 9_000
    assert redis_client.pttl(KEYS.lock) > 8_800
    # The listing index says when the lease now ends, on the server clock.
    assert before_ms + new_ms <= redis_client.zscore(KEYS.index, "raw") <= after_ms + new_ms


def test_extend_many_renews_each_lock_held_with_its_token_and_no_other(redis_client):
    """One call renews several locks (of several buckets on one server, of one on a
    Cluster): a lock held with
    its token gets at least its lease (a longer one is kept) and its bucket's index entry;
    a lock held with another token (or one its token is a prefix of), held shared, or not
    held answers -2 and is left as it was."""
    names = [LockKeys.for_name("distlock:", f"many:{number}") for number in range(20_000)]
    if isinstance(redis_client, RedisCluster):  # one bucket: one slot
        names = [keys for keys in names if keys.bucket == names[0].bucket]
    locks = names[:6]
    short, long, other, prefix, shared, missing = locks
    for keys, token, px in ((short, "t1", 1_000), (long, "t2", 9_000), (other, "x", 4_000)):
        redis_client.set(keys.lock, f"{token}\n1\n1\n{px}\n{{}}", px=px)
    redis_client.set(prefix.lock, "t4x\n1\n1\n4000\n{}", px=4_000)
    redis_client.zadd(shared.lock, {"t5": server_time_us(redis_client) // 1000 + 4_000})
    tokens = ("t1", "t2", "t3", "t4", "t5", "t6")
    keys_and_args = [
        (keys.lock, keys.index, token, 5_000, keys.name)
        for keys, token in zip(locks, tokens, strict=True)
    ]
    before_ms = server_time_us(redis_client) // 1000
    leases = redis_client.eval(
        EXTEND_MANY.source,
        12,
        *(key for row in keys_and_args for key in row[:2]),
        *(arg for row in keys_and_args for arg in row[2:]),
    )
    after_ms = server_time_us(redis_client) // 1000
    assert leases[0] == 5_000
    assert 8_900 < leases[1] <= 9_000
    assert leases[2:] == [-2, -2, -2, -2]
    assert 4_900 < redis_client.pttl(short.lock) <= 5_000
    assert redis_client.pttl(long.lock) > 8_800
    assert redis_client.pttl(other.lock) <= 4_000
    assert redis_client.pttl(prefix.lock) <= 4_000
    assert redis_client.type(shared.lock) == b"zset"
    assert redis_client.exists(missing.lock) == 0
    for keys, lease in ((short, leases[0]), (long, leases[1])):
        score = redis_client.zscore(keys.index, keys.name)
        assert before_ms + lease <= score <= after_ms + lease
    for keys in (other, prefix, shared, missing):
        assert redis_client.zscore(keys.index, keys.name) is None


def test_scripts_only_act_on_their_own_token(redis_client):
    hold(redis_client, "mine", 5_000)
    # A token that is a prefix of the holder's must not match either.
    for token in ("other", "min", "mine2"):
        assert extend(redis_client, token, 60_000, "set") == -2
        assert redis_client.eval(TTL.source, 1, KEYS.lock, token) == -2
        assert redis_client.eval(RELEASE.source, 10, *KEYS.all(), token, "raw", 3000) == b"not held"
    assert redis_client.pttl(KEYS.lock) <= 5_000
    assert redis_client.eval(TTL.source, 1, KEYS.lock, "mine") > 0
    assert redis_client.eval(RELEASE.source, 10, *KEYS.all(), "mine", "raw", 3000) == b"released"
    assert redis_client.exists(KEYS.lock) == 0


def test_a_failed_attempt_reports_the_holder_lease(redis_client):
    hold(redis_client, "holder", 4_000)
    reply = redis_client.eval(
        ACQUIRE.source, 10, *KEYS.all(), "newcomer", 1000, "{}", "raw", 60_000, "", 3000, "0", ""
    )
    assert reply[0] == b"busy"
    assert 3_900 < reply[1] <= 4_000
    redis_client.persist(KEYS.lock)
    reply = redis_client.eval(
        ACQUIRE.source, 10, *KEYS.all(), "newcomer", 1000, "{}", "raw", 60_000, "", 3000, "0", ""
    )
    assert reply == [b"busy", -1, b""]  # a key without expiry: unknown


def acquire(
    redis_client, token: str, *, fence_memory_ms: int = 60_000, end_wait: str = "", waiter=""
):
    reply = redis_client.eval(
        ACQUIRE.source,
        10,
        *KEYS.all(waiter),
        token,
        1000,
        "{}",
        "raw",
        fence_memory_ms,
        "",
        3000,
        "0",
        end_wait,
    )
    # Taken: [1, fence, acquired_at_us] whichever of its two shapes the script answered.
    if isinstance(reply, bytes):
        tag, fence, *at = reply.split()
        assert tag == b"taken"
        return [1, int(fence), int(at[0]) if at else int(fence)]
    assert reply[0] == b"busy"
    return [0, *reply[1:]]


def test_a_fresh_acquire_answers_its_fence_alone_when_it_is_the_acquisition_time(
    redis_client,
):
    reply = redis_client.eval(
        ACQUIRE.source, 10, *KEYS.all(), "t", 1000, "{}", "raw", 60_000, "", 3000, "0", ""
    )
    tag, fence = reply.split()  # "taken FENCE": the acquisition time too
    assert tag == b"taken"
    value = redis_client.get(KEYS.lock).split(b"\n")
    assert int(value[1]) == int(value[2]) == int(fence)  # fence and acquired_at_us
    redis_client.delete(KEYS.lock)
    redis_client.set(KEYS.fence, int(fence) + 10**12)  # a counter ahead of the clock
    reply = redis_client.eval(
        ACQUIRE.source, 10, *KEYS.all(), "u", 1000, "{}", "raw", 60_000, "", 3000, "0", ""
    )
    tag, fence, at = reply.split()
    assert tag == b"taken"
    assert int(fence) == int(redis_client.get(KEYS.fence)) > int(at)
    assert redis_client.get(KEYS.lock).split(b"\n")[1:3] == [fence, at]  # stored as answered


@pytest.mark.parametrize("fair", ["0", "1"])
def test_an_attempt_on_a_busy_lock_changes_neither_the_lock_nor_its_fence(redis_client, fair):
    hold(redis_client, "holder", 4_000)
    redis_client.set(KEYS.fence, 7)
    reply = redis_client.eval(
        ACQUIRE.source, 10, *KEYS.all(), "newcomer", 1000, "{}", "raw", 60_000, "", 3000, fair, ""
    )
    assert reply[0] == b"busy"
    assert redis_client.get(KEYS.lock) == b"holder\n1\n1\n4000\n{}"
    assert redis_client.get(KEYS.fence) == b"7"
    assert redis_client.ttl(KEYS.fence) == -1


def test_a_retried_acquire_recognises_its_own_token(redis_client):
    """redis-py retries a command whose reply was lost: the retry must report the lock
    taken (with the same fence), not busy, or the caller would hold it unknowingly."""
    first = acquire(redis_client, "mine")
    assert first[0] == 1
    assert acquire(redis_client, "mine") == first
    assert acquire(redis_client, "mine2")[0] == 0  # a longer token is someone else
    assert acquire(redis_client, "min")[0] == 0  # and so is a prefix


def test_fence_is_the_larger_of_the_counter_and_the_server_clock(redis_client):
    seconds, micros = redis_client.time()
    redis_client.set(KEYS.fence, 10)  # a counter behind the clock: the clock wins
    fence = int(acquire(redis_client, "a")[1])
    assert fence >= seconds * 1_000_000 + micros
    redis_client.delete(KEYS.lock)
    ahead = fence + 10**12  # a counter ahead of the clock (it stepped back): counter + 1
    redis_client.set(KEYS.fence, ahead)
    assert int(acquire(redis_client, "b")[1]) == ahead + 1
    assert int(redis_client.get(KEYS.fence)) == ahead + 1


def test_the_fence_counter_outlives_the_lease_by_the_fence_memory(redis_client):
    acquire(redis_client, "a", fence_memory_ms=5_000)
    assert 5_900 < redis_client.pttl(KEYS.fence) <= 6_000  # lease 1 s + 5 s


def test_acquires_drop_index_entries_of_locks_that_expired_now_and_then(redis_client):
    redis_client.zadd(KEYS.index, {"crashed": 1, "alive": 2**52})
    acquire(redis_client, "a")
    assert redis_client.zscore(KEYS.index, "raw") is not None
    # One acquire in 16 prunes (by the server clock's microseconds): after 2,000 the
    # chance that none did is below 1e-56.
    for _ in range(2_000):
        redis_client.eval(RELEASE.source, 8, *KEYS.all()[:8], "a", "raw", 3000)
        acquire(redis_client, "a")
        if redis_client.zscore(KEYS.index, "crashed") is None:
            break
    assert redis_client.zrange(KEYS.index, 0, -1) == [b"raw", b"alive"]


def test_ending_a_wait_pushes_a_mark_after_everything_else(redis_client):
    """The mark must survive the script (a fair head's own list is cleared when it takes
    the lock), so the BLPOP it ends always gets an answer."""
    reply = acquire(redis_client, "a", end_wait="1", waiter="w1")
    assert reply[0] == 1
    assert redis_client.lrange(KEYS.wake("w1"), 0, -1) == [b"c"]
    assert 0 < redis_client.pttl(KEYS.wake("w1")) <= 3000
    redis_client.eval(PASS_ON.source, 10, *KEYS.all("w2"), "", 3000, "0", "1")
    assert redis_client.lrange(KEYS.wake("w2"), 0, -1) == [b"c"]


def test_a_release_names_the_fair_waiter_whose_turn_it_is(redis_client):
    """The first fair waiter's own list is not among the lock's keys: the release returns
    it, and the caller wakes it with WAKE (every key a script touches is declared)."""
    hold(redis_client, "mine", 5_000)
    fair = ("newcomer", 1000, "{}", "raw", 60_000, "w1", 3000, "1", "")
    assert redis_client.eval(ACQUIRE.source, 10, *KEYS.all("w1"), *fair)[0] == b"busy"  # queued
    released = redis_client.eval(RELEASE.source, 10, *KEYS.all(), "mine", "raw", 3000)
    assert released == [b"released", b"w1"]
    assert redis_client.llen(KEYS.wake("w1")) == 0  # untouched: it was not declared
    assert redis_client.eval(WAKE.source, 1, KEYS.wake("w1"), 3000) == 1
    assert redis_client.lrange(KEYS.wake("w1"), 0, -1) == [b"1"]


@pytest.mark.parametrize(
    ("waiters", "woken"),
    [
        ({"live": 3_600_000}, True),
        ({"lapsed": -1_000}, False),
        ({"lapsed": -1_000, "live": 3_600_000}, True),
    ],
    ids=["one live", "only lapsed", "lapsed and live"],
)
def test_a_release_wakes_an_unfair_waiter_only_while_one_is_live(redis_client, waiters, woken):
    """A release pushes to the shared signal list while a live waiter is registered, and
    drops lapsed waiters without a wake-up nobody would take."""
    now_ms = server_time_us(redis_client) // 1000
    redis_client.zadd(KEYS.waiters, {w: now_ms + ms for w, ms in waiters.items()})
    hold(redis_client, "mine", 5_000)
    assert redis_client.eval(RELEASE.source, 10, *KEYS.all(), "mine", "raw", 3000) == b"released"
    assert redis_client.lrange(KEYS.signal, 0, -1) == ([b"1"] if woken else [])
    assert redis_client.zrange(KEYS.waiters, 0, -1) == ([b"live"] if woken else [])


def test_every_key_a_script_touches_is_declared():
    """No script builds a key name: every key argument of redis.call is KEYS[i]."""
    pattern = re.compile(r"redis\.p?call\('(\w+)',\s*([^,)]+)")
    keyless = {"TIME"}
    for script in SCRIPTS:
        for command, first in pattern.findall(script.source):
            if command not in keyless:
                assert re.fullmatch(
                    r"KEYS\[(\d+|[245] \* i( - \d)?|#KEYS|i|i \+ 1)\]", first.strip()
                ), (
                    script.name,
                    command,
                    first,
                )


def test_list_index_reads_the_holds_index_in_the_same_call(redis_client):
    now_ms = server_time_us(redis_client) // 1000
    index, holds = KEYS.index, KEYS.holder_index
    redis_client.zadd(index, {"raw": now_ms + 60_000, "dead": now_ms - 1000})
    redis_client.zadd(
        holds,
        {"s\0t1": now_ms + 30_000, "s\0t2": now_ms + 40_000, "x\0t3": now_ms - 1000},
    )

    def run(*args: str, keys: tuple[str, ...] = (index, holds)) -> list:
        return redis_client.eval(LIST_INDEX.source, len(keys), *keys, *args)

    _now, entries, found = run("*")
    assert entries == b"raw\0" + str(now_ms + 60_000).encode()
    assert found.split(b"\0") == [
        b"s",
        b"t1",
        str(now_ms + 30_000).encode(),
        b"s",
        b"t2",
        str(now_ms + 40_000).encode(),
    ]
    assert run("#")[1:] == [1, 2]
    _now, entries, found = run("=", "s", "raw", "x")
    assert entries.split(b"\0")[0] == b"raw"
    assert found.split(b"\0")[0::3] == [b"s", b"s"]
    assert run("=", "raw")[2] == b""
    # The holds' index is only read (the scripts that add holds prune it); without it,
    # the reply says nothing of holds.
    assert redis_client.zscore(holds, "x\0t3") is not None
    assert redis_client.zscore(index, "dead") is None
    assert run("*", keys=(index,))[2] == b""
    assert run("#", keys=(index,))[2] == 0


@single_server_only  # the other topologies' primaries have replicas: writes are allowed
def test_a_server_refusing_writes_still_answers_busy_for_a_held_lock(redis_client):
    """An unfair acquire takes a free lock with ``SET NX GET``, a write: a server that
    refuses writes (here: no replica for ``min-replicas-to-write``) must still answer
    "busy" for a held lock, as a read would, and refuse taking a free one."""
    hold(redis_client, "holder", 4_000)
    args = ("newcomer", 1000, "{}", "raw", 60_000, "", 3000, "0", "")
    for held in (True, False):
        if not held:
            redis_client.delete(KEYS.lock)
        redis_client.config_set("min-replicas-to-write", 1)
        try:
            if held:
                reply = redis_client.eval(ACQUIRE.source, 10, *KEYS.all(), *args)
                assert reply[0] == b"busy"
            else:
                with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
                    redis_client.eval(ACQUIRE.source, 10, *KEYS.all(), *args)
        finally:
            redis_client.config_set("min-replicas-to-write", 0)
    assert redis_client.exists(KEYS.lock) == 0
