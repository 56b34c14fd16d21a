"""The deploy checks (``check --deploy``, ``django_distlock/checks/servers.py``) on the
topologies the suite starts: where locks live (I001), a lock server that does not answer
(W001), one that evicts (W002), and replicas not waited for (W003)."""

from __future__ import annotations

import pytest
from django.core.checks import Warning, run_checks
from django.test import override_settings

from tests.support.checks import deploy_messages
from tests.support.engine import closed_port
from tests.support.redis_servers import HOST
from tests.support.topologies import ClusterSetup


def test_i001_mentions_min_replicas(redis_server):
    with override_settings(DISTLOCK={"URL": redis_server.url, "MIN_REPLICAS": 1}):
        [info] = deploy_messages()
    assert info.msg.endswith(
        "; an acquire counts once 1 replica(s) acknowledged it within 0.1 s "
        "(MIN_REPLICAS, REPLICA_TIMEOUT)"
    )


def test_i001_is_deploy_only(redis_server):
    with override_settings(DISTLOCK={"URL": redis_server.url}):
        assert run_checks(tags=["distlock"]) == []


def test_w001_when_no_sentinel_answers():
    sentinels = [(HOST, closed_port()), (HOST, closed_port())]
    with override_settings(DISTLOCK={"SENTINELS": sentinels, "SENTINEL_SERVICE": "mymaster"}):
        [info, warning] = deploy_messages()
    assert info.id == "django_distlock.I001"
    assert isinstance(warning, Warning)
    assert warning.id == "django_distlock.W001"
    addresses = ", ".join(f"{host}:{port}" for host, port in sentinels)
    assert warning.msg.startswith(
        f"No Sentinel ({addresses}) names a primary for service 'mymaster' within 2 s: "
        "MasterNotFoundError"
    )
    assert "SENTINEL_KWARGS" in warning.hint


def test_w001_when_the_sentinels_do_not_know_the_service(sentinel_setup):
    distlock = {"SENTINELS": sentinel_setup.sentinels, "SENTINEL_SERVICE": "nosuchservice"}
    with override_settings(DISTLOCK=distlock):
        [_info, warning] = deploy_messages()
    assert warning.id == "django_distlock.W001"
    assert "names a primary for service 'nosuchservice'" in warning.msg


def test_w001_when_no_cluster_seed_answers():
    seeds = [f"redis://{HOST}:{closed_port()}", f"redis://:secret@{HOST}:{closed_port()}"]
    with override_settings(DISTLOCK={"CLUSTER": seeds}):
        [_info, warning] = deploy_messages()
    assert warning.id == "django_distlock.W001"
    assert warning.msg.startswith("No seed node of the Redis Cluster answers CLUSTER SLOTS")
    assert "secret" not in warning.msg
    assert "DISTLOCK['CLUSTER']" in warning.hint


def test_w001_names_the_cluster_primary_that_does_not_answer():
    # No replicas: with one, the paused primary was failed over (1 s node timeout) before
    # a slow check run read CLUSTER SLOTS, and every primary then answered.
    with ClusterSetup(replicas_per_shard=0) as cluster:
        stalled = cluster.primaries[1]
        seeds = [f"redis://{HOST}:{node.port}" for node in cluster.nodes if node is not stalled]
        with override_settings(DISTLOCK={"CLUSTER": seeds}):
            assert [m.id for m in deploy_messages()] == ["django_distlock.I001"]
            stalled.pause()
            try:
                messages = deploy_messages()
            finally:
                stalled.resume()
    assert [m.id for m in messages] == ["django_distlock.I001", "django_distlock.W001"], messages
    warning = messages[1]
    assert warning.msg.startswith(
        f"Redis at '{HOST}:{stalled.port}' (a Redis Cluster primary) does not answer PING"
    )


@pytest.mark.parametrize("topology", ["sentinel", "cluster"])
def test_w002_names_each_evicting_primary(topology, request):
    if topology == "sentinel":
        setup = request.getfixturevalue("sentinel_setup")
        evicting = setup.primary
        distlock = {"SENTINELS": setup.sentinels, "SENTINEL_SERVICE": "mymaster"}
        label = f"Redis at '{HOST}:{evicting.port}' (the primary of Sentinel service 'mymaster')"
    else:
        setup = request.getfixturevalue("cluster_setup")
        evicting = setup.primaries[2]
        distlock = {"CLUSTER": setup.urls[:1]}
        label = f"Redis at '{HOST}:{evicting.port}' (a Redis Cluster primary)"
    with evicting.client() as client, override_settings(DISTLOCK=distlock):
        client.config_set("maxmemory-policy", "volatile-lru")
        try:
            [_info, warning] = deploy_messages()
        finally:
            client.config_set("maxmemory-policy", "noeviction")
    assert warning.id == "django_distlock.W002"
    assert warning.msg.startswith(
        f"{label} evicts keys when it is full (maxmemory-policy volatile-lru)"
    )
    assert "on its replicas too" in warning.hint


def test_w003_when_the_lock_server_has_replicas_and_min_replicas_is_0(replicated_setup):
    url = replicated_setup.primary.url
    with override_settings(DISTLOCK={"URL": url, "MIN_REPLICAS": 0}):
        [_info, warning] = deploy_messages()
    assert isinstance(warning, Warning)
    assert warning.id == "django_distlock.W003"
    assert warning.msg.startswith(
        f"Redis at '{url}' has 2 connected replicas, but DISTLOCK['MIN_REPLICAS'] is 0: "
        "no acquire waits for a replica"
    )
    assert "the default 'auto' waits for one replica" in warning.hint
    for setting in ({"URL": url}, {"URL": url, "MIN_REPLICAS": 1}):  # "auto", or a count
        with override_settings(DISTLOCK=setting):
            assert [message.id for message in deploy_messages()] == ["django_distlock.I001"]


def test_no_w003_without_replicas(redis_server):
    with override_settings(DISTLOCK={"URL": redis_server.url, "MIN_REPLICAS": 0}):
        assert [message.id for message in deploy_messages()] == ["django_distlock.I001"]
