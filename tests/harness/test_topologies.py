"""The Sentinel, Cluster and replicated topologies of ``tests/support/topologies.py``."""

import signal
import time

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.sentinel import SentinelConnectionPool

from tests.support.servers import process_exists
from tests.support.topologies import (
    ClusterSetup,
    ReplicatedSetup,
    SentinelSetup,
    SlotMigration,
    TopologyError,
)


def write_following_failover(client, key, value) -> None:
    """redis-py 8.1: a pooled connection still open to the demoted primary fails one
    write with ConnectionError; the next command reconnects through the Sentinels (see
    tests/test_connections_clients.py)."""
    try:
        client.set(key, value)
    except redis.ConnectionError:
        client.set(key, value)


def keys_in_slot_of(tag: str, count: int) -> list[str]:
    return [f"{{{tag}}}:{index}" for index in range(count)]


def test_replicas_start_in_sync_and_acknowledge(replicated_setup):
    with replicated_setup.client() as client:
        client.set("k", "v")
        assert client.wait(2, 1000) == 2
    assert replicated_setup.connected_replicas() == 2
    for replica in replicated_setup.replicas:
        with replica.client() as client:
            assert client.get("k") == b"v"


def test_a_paused_replica_does_not_acknowledge_until_resumed(replicated_setup):
    with replicated_setup.client() as client:
        replicated_setup.pause_replica(0)
        client.set("k", "v")
        assert client.wait(2, 200) == 1
        replicated_setup.resume_replica(0)
        assert client.wait(2, 1000) == 2


def test_a_killed_replica_restarts_and_catches_up(replicated_setup):
    replicated_setup.kill_replica(1)
    with replicated_setup.client() as client:
        client.set("k", "v")
        assert client.wait(2, 200) == 1
        replica = replicated_setup.restart_replica(1)
        assert client.wait(2, 1000) == 2
    with replica.client() as client:
        assert client.get("k") == b"v"


def test_sentinel_setup_serves_its_primary_through_the_sentinels(sentinel_setup):
    setup = sentinel_setup
    assert setup.service_name == "mymaster"
    assert len(setup.sentinels) == 3
    assert setup.reported_primaries() == {setup.primary.address}
    for sentinel in setup.sentinel_servers:
        with sentinel.client(decode_responses=True) as client:
            # Not sentinel_ckquorum(): with decode_responses it returns False for "OK ...".
            reply = client.execute_command("SENTINEL", "CKQUORUM", setup.service_name)
            assert reply.startswith("OK 3 usable Sentinels")
    client = setup.client()
    assert isinstance(client.connection_pool, SentinelConnectionPool)
    client.set("sentinel:k", "v")
    assert client.get("sentinel:k") == b"v"
    setup.wait_replica_in_sync()
    with setup.replica.client() as replica:
        assert replica.get("sentinel:k") == b"v"
        assert replica.info("replication")["role"] == "slave"
    client.close()


def test_sentinel_failover_promotes_the_replica_and_the_client_follows(private_sentinel):
    setup = private_sentinel
    old_primary, old_replica = setup.primary, setup.replica
    client = setup.client(socket_timeout=2)
    client.set("k", "before")
    setup.wait_replica_in_sync()

    seconds = setup.failover()

    assert seconds < 10
    assert setup.primary is old_replica
    assert setup.replica is old_primary
    assert setup.reported_primaries() == {old_replica.address}
    assert client.get("k") == b"before"
    write_following_failover(client, "k", "after")
    with old_replica.client() as new_primary:
        assert new_primary.get("k") == b"after"
    setup.wait_replica_in_sync()
    with old_primary.client() as demoted:
        assert demoted.get("k") == b"after"
        with pytest.raises(redis.ReadOnlyError):
            demoted.set("k", "split brain")
    client.close()


def test_a_killed_primary_is_failed_over_and_can_come_back_as_replica(private_sentinel):
    setup = private_sentinel
    old_primary = setup.primary
    client = setup.client(socket_timeout=2)
    client.set("k", "replicated")
    setup.wait_replica_in_sync()

    seconds = setup.kill_primary_and_wait_for_failover()

    assert 0.5 < seconds < 8, f"failover took {seconds:.2f} s"
    assert not old_primary.running
    assert setup.replica is old_primary
    assert client.get("k") == b"replicated"
    client.set("k", "new")

    setup.restart_replica()
    assert old_primary.running
    with old_primary.client() as replica:
        assert replica.get("k") == b"new"
    # Healthy again: the Sentinels can fail over a second time.
    setup.failover()
    assert setup.primary is old_primary
    write_following_failover(client, "k", "newer")
    assert client.get("k") == b"newer"
    client.close()


def test_a_paused_primary_is_failed_over(private_sentinel):
    setup = private_sentinel
    paused = setup.pause_primary()
    assert paused.paused
    setup.wait_for_failover(paused)
    assert setup.primary is not paused
    assert setup.resume_primary() is paused
    assert not paused.paused
    with setup.client(socket_timeout=2) as client:
        client.set("k", "v")


def test_cluster_setup_serves_every_slot_with_a_replica_per_shard(cluster_setup):
    cluster = cluster_setup
    assert len(cluster.nodes) == 6
    assert len(cluster.primaries) == 3
    assert len(cluster.replicas) == 3
    assert len(cluster.startup_nodes) == 6
    assert cluster.urls[0] == f"redis://127.0.0.1:{cluster.nodes[0].port}"
    for primary in cluster.primaries:
        assert len(cluster.replicas_of(primary)) == 1
    for node in cluster.nodes:
        with node.client(decode_responses=True) as client:
            assert client.cluster("info")["cluster_state"] == "ok"
    client = cluster.client()
    assert isinstance(client, RedisCluster)
    keys = [f"cluster:{index}" for index in range(30)]
    for key in keys:
        client.set(key, key)
    owners = {cluster.node_for_key(key) for key in keys}
    assert owners == set(cluster.primaries)
    for key in keys:
        with cluster.node_for_key(key).client() as owner:
            assert owner.get(key) == key.encode()
    assert cluster.primary_for_slot(0) is cluster.primaries[0]
    assert cluster.primary_for_slot(16383) is cluster.primaries[-1]
    client.delete(*keys)


def test_slot_migration_sends_clients_ask_then_moved_and_they_succeed(private_cluster):
    cluster = private_cluster
    keys = keys_in_slot_of("migrating", 10)
    slot = key_slot(keys[0].encode())
    source = cluster.primary_for_slot(slot)
    target = next(node for node in cluster.primaries if node is not source)
    client = cluster.client()
    for key in keys:
        client.set(key, key)

    def while_migrating(migration: SlotMigration) -> None:
        assert migration.source is source
        assert migration.target is target
        migration.move_keys(keys[:5])
        assert migration.keys_left() == 5
        for key in keys:
            assert client.get(key) == key.encode()
        client.set(keys[0], "written during the migration")
        assert source.error_count("ASK") >= 2
        assert target.command_calls("asking") >= 2
        # Still the source's slot until SETSLOT NODE.
        assert cluster.primary_for_slot(slot) is source

    cluster.migrate_slot(slot, target, batch=2, on_migrating=while_migrating)

    assert cluster.primary_for_slot(slot) is target
    assert source.error_count("MOVED") == 0
    assert client.get(keys[0]) == b"written during the migration"
    assert source.error_count("MOVED") == 1
    for key in keys[1:]:
        assert client.get(key) == key.encode()
    with source.client() as on_source:
        assert on_source.cluster("countkeysinslot", slot) == 0
    with target.client() as on_target:
        assert on_target.cluster("countkeysinslot", slot) == 10


def test_a_killed_cluster_primary_fails_over_with_its_replicated_keys(private_cluster):
    cluster = private_cluster
    keys = keys_in_slot_of("shard", 20)
    client = cluster.client()
    for key in keys:
        client.set(key, key)
    old_primary = cluster.node_for_key(keys[0])
    (replica,) = cluster.replicas_of(old_primary)
    replica.wait_until_in_sync(old_primary)

    promoted = cluster.failover_primary(old_primary)

    assert promoted is replica
    assert not old_primary.running
    assert cluster.node_for_key(keys[0]) is promoted
    assert old_primary not in cluster.primaries
    for key in keys:
        assert client.get(key) == key.encode()
    client.set(keys[0], "after")

    cluster.restart_node(old_primary)
    assert cluster.replicas_of(promoted) == [old_primary]
    cluster.wait_replicas_in_sync()
    with old_primary.client() as rejoined:
        assert rejoined.execute_command("READONLY")
        assert rejoined.get(keys[0]) == b"after"


def test_a_graceful_cluster_failover_swaps_primary_and_replica(private_cluster):
    cluster = private_cluster
    client = cluster.client()
    client.set("k", "v")
    old_primary = cluster.node_for_key("k")
    (replica,) = cluster.replicas_of(old_primary)

    assert cluster.failover_primary(old_primary, graceful=True) is replica

    assert cluster.node_for_key("k") is replica
    assert cluster.replicas_of(replica) == [old_primary]
    assert client.get("k") == b"v"


def test_failover_of_a_shard_without_replica_is_refused(private_cluster):
    cluster = private_cluster
    primary = cluster.primaries[0]
    (replica,) = cluster.replicas_of(primary)
    replica.kill()
    with pytest.raises(TopologyError, match="no running replica"):
        cluster.failover_primary(primary)


def test_a_wait_that_times_out_says_what_it_waited_for_and_shows_the_logs(sentinel_setup):
    primary = sentinel_setup.primary
    with pytest.raises(TopologyError, match=r"(?s)failover away from .*--- .*server\.log"):
        sentinel_setup.wait_for_failover(primary, timeout=0.2)
    assert sentinel_setup.primary is primary


@pytest.mark.parametrize(
    "make",
    [ReplicatedSetup, SentinelSetup, ClusterSetup],
    ids=["replicated", "sentinel", "cluster"],
)
def test_stop_leaves_no_process_and_no_directory_behind(make):
    setup = make()
    began = time.monotonic()
    setup.start()
    took = time.monotonic() - began
    pids = setup.pids
    directories = [server.log_path.parent for server in setup.servers]
    assert len(pids) == len(setup.servers)
    assert 0 < setup.start_seconds <= took
    setup.servers[-1].pause()
    setup.stop()
    assert setup.stop_seconds < 5
    assert not [pid for pid in pids if process_exists(pid)]
    assert not [directory for directory in directories if directory.exists()]


def test_topologies_are_stopped_at_interpreter_exit(run_server_child):
    pids, returncode = run_server_child(
        """
        from tests.support.topologies import ReplicatedSetup, SentinelSetup
        setups = [ReplicatedSetup().start(), SentinelSetup().start()]
        print(*(pid for setup in setups for pid in setup.pids), flush=True)
        """
    )
    assert returncode == 0
    assert len(pids) == 3 + 5


def test_topologies_are_killed_when_the_test_process_is_terminated(run_server_child):
    pids, returncode = run_server_child(
        """
        import time
        from tests.support.servers import install_termination_cleanup
        from tests.support.topologies import ClusterSetup
        install_termination_cleanup()
        print(*ClusterSetup().start().pids, flush=True)
        time.sleep(60)
        """,
        terminate=True,
    )
    assert returncode == -signal.SIGTERM
    assert len(pids) == 6
