"""``min_replicas="auto"``: what it knows of each primary's replicas (``ReplicaCounts``,
no I/O), and on the suite's real topologies: a ``WAIT`` for one replica where the lock's
primary has one (Sentinel, every Cluster shard), none on a server without replicas."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import redis

from django_distlock.engine import (
    AUTO_REPLICAS,
    Backend,
    Lock,
    LockGroup,
    LockNotReplicated,
    Tuning,
)
from django_distlock.engine.keys import bucket_of
from django_distlock.engine.transport.replication import ReplicaCounts, Replication, replication_of
from tests.support.engine import keys_of, primaries_of
from tests.support.topologies import ReplicatedSetup


def info(role: str, *replicas: str, replid: str = "a" * 40) -> bytes:
    """An ``INFO replication`` reply as read from the connection."""
    lines = ["# Replication", f"role:{role}", f"connected_slaves:{len(replicas)}"]
    lines += [f"slave{n}:ip=127.0.0.1,port={7000 + n},{state}" for n, state in enumerate(replicas)]
    lines += [f"master_replid:{replid}", "master_repl_offset:3058"]
    return "\r\n".join(lines).encode() + b"\r\n"


ONLINE = "state=online,offset=3058,lag=0"
SYNCING = "state=wait_bgsave,offset=0,lag=0"
PRIMARY_WITH_ONE = info("master", ONLINE)
PRIMARY_WITH_NONE = info("master")
REPLICA = info("slave")


# -- what "auto" knows, without I/O -----------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "replication"),
    [
        (PRIMARY_WITH_ONE, Replication("master", 1)),
        (info("master", ONLINE, ONLINE, replid="b" * 40), Replication("master", 2)),
        (info("master", ONLINE, SYNCING), Replication("master", 1)),  # in sync only
        (PRIMARY_WITH_NONE, Replication("master", 0)),
        (PRIMARY_WITH_ONE.decode(), Replication("master", 1)),
        (REPLICA, Replication("slave", 0)),
        (redis.ResponseError("NOPERM this user has no permissions to run 'info'"), None),
        (b"", None),
        (3, None),
    ],
)
def test_replication_of_reads_an_info_replication_reply(reply, replication):
    assert replication_of(reply) == replication


def test_a_server_is_read_when_first_used_then_at_most_every_replica_check():
    counts = ReplicaCounts(Tuning(replica_check=1.0))
    assert counts.due("a", now=100.0)
    assert not counts.due("a", now=100.0)  # claimed: concurrent acquires do not all read
    assert not counts.due("a", now=100.9)
    assert counts.due("a", now=101.0)
    assert counts.due("b", now=101.0)  # each server on its own


def test_auto_waits_for_one_replica_where_the_primary_reported_one():
    counts = ReplicaCounts(Tuning())
    assert counts.required("a", now=0.0) == 0  # never read
    counts.learn("a", PRIMARY_WITH_NONE, now=0.0)
    assert counts.required("a", now=0.0) == 0
    counts.learn("a", PRIMARY_WITH_ONE, now=1.0)
    assert counts.required("a", now=1.0) == 1
    counts.learn("a", info("master", ONLINE, ONLINE), now=2.0)
    assert counts.required("a", now=2.0) == 1  # one, whatever the count
    assert counts.required("b", now=2.0) == 0


def test_a_primary_that_lost_its_replica_is_waited_on_for_the_grace():
    """A planned failover promotes the replica first (the old primary lists none) and
    demotes the old primary later: until then, what it grants is what a failover loses."""
    counts = ReplicaCounts(Tuning(replica_grace=5.0))
    counts.learn("a", PRIMARY_WITH_ONE, now=10.0)
    counts.learn("a", PRIMARY_WITH_NONE, now=11.0)
    assert counts.required("a", now=11.0) == 1
    assert counts.required("a", now=14.9) == 1
    assert counts.required("a", now=15.0) == 0  # the replica is gone for good: stop waiting
    counts.learn("a", REPLICA, now=16.0)  # demoted: nothing to wait for on it
    assert counts.required("a", now=16.0) == 0


def test_behind_one_name_the_new_primary_does_not_stop_the_waits_on_the_old_one():
    """During a Sentinel failover the reading may come from the promoted replica (a new
    connection, no replica yet) while open connections still reach the old primary."""
    counts = ReplicaCounts(Tuning(replica_grace=5.0))
    counts.learn("a", PRIMARY_WITH_ONE, now=10.0)
    counts.learn("a", info("master", replid="c" * 40), now=11.0)
    assert counts.required("a", now=11.0) == 1


def test_after_a_connection_failed_the_server_is_read_again_and_still_waited_on():
    """A connection failed: the primary may have changed, so the next acquire reads the
    server again. The grace stays: the cut may be followed at once by another failover
    whose old primary lost its replica (back-to-back failovers in the chaos runs)."""
    counts = ReplicaCounts(Tuning(replica_check=1.0, replica_grace=5.0))
    assert counts.due("a", now=10.0)
    counts.learn("a", PRIMARY_WITH_ONE, now=10.0)
    assert not counts.due("a", now=10.1)
    counts.lost("a")
    assert counts.due("a", now=10.1)
    counts.learn("a", info("master", replid="c" * 40), now=10.1)
    assert counts.required("a", now=10.1) == 1
    assert counts.required("a", now=15.0) == 0
    counts.lost("b")  # a server never read: nothing to forget


def test_a_server_refusing_info_waits_for_none_and_says_so_once(caplog):
    counts = ReplicaCounts(Tuning())
    refused = redis.ResponseError("unknown command 'INFO'")
    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        counts.learn("a", refused, now=0.0)
        counts.learn("a", refused, now=5.0)
    assert counts.required("a", now=5.0) == 0
    [record] = caplog.records
    assert "did not answer INFO replication" in record.getMessage()
    assert "set MIN_REPLICAS to a number" in record.getMessage()


# -- on real servers --------------------------------------------------------------------


def _waits(client: redis.Redis) -> int:
    """``WAIT`` commands run so far on every primary (``INFO commandstats``)."""
    stats = (primary.info("commandstats") for primary in primaries_of(client))
    return sum(entry.get("cmdstat_wait", {}).get("calls", 0) for entry in stats)


async def _load_scripts(api, backend: Backend, names: list[str]) -> None:
    """Run the scripts once on every node (a first ``EVALSHA`` refused with ``NOSCRIPT``
    is sent again, ``WAIT`` included)."""
    for name in names:
        lock = Lock(name, backend=backend, auto_renew=False, min_replicas=0)
        assert await api.acquire(lock)
        await api.release(lock)


async def test_auto_waits_where_the_primary_has_a_replica_and_not_where_it_has_none(
    api, topology, make_backend, redis_client
):
    """The suite's single server has no replica: no ``WAIT``. Its Sentinel primary and
    each Cluster primary have one: every acquire waits for it."""
    backend = make_backend(min_replicas=AUTO_REPLICAS)
    names = [f"auto:{n}" for n in range(12)]  # spread over every shard of the cluster
    await _load_scripts(api, backend, names)
    before = _waits(redis_client)
    for name in names:
        lock = Lock(name, backend=backend, auto_renew=False)
        assert await api.acquire(lock)
        await api.release(lock)
    waits = _waits(redis_client) - before
    assert waits == (0 if topology.name == "single" else len(names))


async def test_an_explicit_count_overrides_auto_per_lock(api, topology, make_backend, redis_client):
    backend = make_backend(min_replicas=AUTO_REPLICAS)
    await _load_scripts(api, backend, ["auto:off"])
    before = _waits(redis_client)
    lock = Lock("auto:off", backend=backend, auto_renew=False, min_replicas=0)
    assert await api.acquire(lock)
    await api.release(lock)
    assert _waits(redis_client) == before


async def test_auto_refuses_what_no_replica_acknowledged_then_stops_waiting_for_a_gone_one(
    api, redis_server_factory
):
    """Replicas paused: "auto" waits for one, none acknowledges, the acquire is given
    back (``LockNotReplicated``). The replica killed: after the grace, "auto" reads the
    primary alone and takes locks without waiting."""
    tuning = Tuning(replica_check=0.05, replica_grace=2.0)
    with ReplicatedSetup(replicas=1) as setup:
        client = setup.client()
        backend = Backend(
            client,
            async_client=lambda: redis.asyncio.Redis.from_url(setup.primary.url),
            min_replicas=AUTO_REPLICAS,
            tuning=tuning,
        )
        try:
            lock = Lock("auto:paused", backend=backend, auto_renew=False)
            assert await api.acquire(lock)
            await api.release(lock)
            setup.pause_replica(0)
            try:
                with pytest.raises(LockNotReplicated, match="only 0 of the 1 replicas"):
                    await api.acquire(lock, blocking=False)  # a waiter would try again
            finally:
                setup.resume_replica(0)
            assert await api.acquire(lock)  # acknowledged again
            await api.release(lock)
            setup.kill_replica(0)
            with pytest.raises(LockNotReplicated):  # within the grace: still waited on
                await api.acquire(lock, blocking=False)
            await asyncio.sleep(tuning.replica_grace + tuning.replica_check)
            before = _waits(client)
            assert await api.acquire(lock)
            await api.release(lock)
            assert _waits(client) == before
        finally:
            backend.close()
            await backend.aclose()
            client.close()


# -- a group (distlock_many) waits for its replicas like one lock -------------------------


async def test_a_group_waits_for_replicas_where_one_lock_would(
    api, topology, make_backend, redis_client
):
    """Under "auto" each of a group's scripts (one per bucket on a Cluster) is followed by
    a ``WAIT`` where its primary has a replica, as every single lock's is; ``0`` turns it
    off for the group as for a lock."""
    names = [f"auto:group:{n}" for n in range(6)]
    loading = LockGroup(names, backend=make_backend(min_replicas=0), auto_renew=False)
    assert await api.acquire(loading)  # loads the script on every node: no NOSCRIPT below
    await api.release(loading)
    backend = make_backend(min_replicas=AUTO_REPLICAS)
    before = _waits(redis_client)
    group = LockGroup(names, backend=backend, auto_renew=False)
    assert await api.acquire(group)
    await api.release(group)
    scripts = len({bucket_of(name) for name in names}) if topology.name == "cluster" else 1
    assert _waits(redis_client) - before == (0 if topology.name == "single" else scripts)
    before = _waits(redis_client)
    unacknowledged = LockGroup(names, backend=backend, auto_renew=False, min_replicas=0)
    assert await api.acquire(unacknowledged)
    await api.release(unacknowledged)
    assert _waits(redis_client) == before


async def test_a_group_no_replica_acknowledged_is_given_back_or_ridden_out_like_one_lock(api):
    """A replica paused: a group acquire that does not wait raises ``LockNotReplicated``
    and holds none of its names (a planned failover's old primary grants exactly such
    holds, which the failover forgets); one that waits tries again within its
    ``blocking_timeout`` and gets the group once the replica acknowledges, as a single
    lock does."""
    tuning = Tuning(replica_check=0.05)
    with ReplicatedSetup(replicas=1) as setup:
        client = setup.client()
        backend = Backend(
            client,
            async_client=lambda: redis.asyncio.Redis.from_url(setup.primary.url),
            min_replicas=AUTO_REPLICAS,
            tuning=tuning,
        )
        names = ["auto:group:a", "auto:group:b", "auto:group:c"]
        try:
            group = LockGroup(names, backend=backend, auto_renew=False)
            assert await api.acquire(group)  # the primary's replica is read, and in sync
            await api.release(group)
            setup.pause_replica(0)
            try:
                with pytest.raises(LockNotReplicated, match="only 0 of the 1 replicas"):
                    await api.acquire(group, blocking=False)
                assert not group.held
                assert all(client.get(keys_of(name).lock) is None for name in names)
                with pytest.raises(LockNotReplicated):  # ridden out until the deadline
                    await api.acquire(group, blocking_timeout=0.3)
                assert all(client.get(keys_of(name).lock) is None for name in names)
                resume = threading.Timer(0.5, setup.resume_replica, (0,))
                started = time.monotonic()
                resume.start()
                try:
                    assert await api.acquire(group, blocking_timeout=5)
                finally:
                    resume.join()
            finally:
                if setup.replicas[0].paused:
                    setup.resume_replica(0)
            assert time.monotonic() - started >= 0.5  # taken once acknowledged, not before
            assert group.held
            await api.release(group)
        finally:
            backend.close()
            await backend.aclose()
            client.close()
