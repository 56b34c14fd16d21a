"""Fixtures of the whole suite: real, private Redis servers and topologies, Django's cache
pointed at them, the check that no test leaves a lock held, and what several
test packages share (proxies, forked children, events off, locks held for a test, a dead
Redis URL). Fixtures of one package live in its own ``conftest.py``; plain helpers in
``tests/support/``.

Topologies: a behaviour test (how locks behave, whatever the servers are) runs on the
shared single server, the session Sentinel setup and the session Cluster, through the
``topology`` fixture that ``backend``, ``make_backend`` and ``redis_client`` use
(:mod:`tests.support.probe`). ``tests/engine/conftest.py`` and ``tests/test_managers.py``
import ``every_topology`` as their ``topology`` (parametrised over ``single``,
``sentinel``, ``cluster``); elsewhere ``topology`` below is the single server, unless a
test parametrises it (``@pytest.mark.parametrize("topology", TOPOLOGIES,
indirect=True)``). A test about one server stays single-server: it asks for
``redis_server``/``private_redis`` without the topology fixtures, or carries
``@single_server_only`` when it uses them. That is a test that kills, pauses or restarts
a server, counts one server's commands, forks with one port, or tests a redis-py client,
pool or setting of one server. ``@one_primary_only`` keeps a test off the cluster (the
key layout before buckets could not run there). Worker processes get the topology as
``Topology.target()``; Django code gets it as ``DISTLOCK`` keys
(``Topology.distlock_settings()``).

The session server is started in ``pytest_configure``. pytest-django imports
``tests.settings`` earlier than that (while loading initial conftests), so the
server URL reaches this process through ``override_settings`` and reaches
subprocesses through ``DISTLOCK_TEST_REDIS_URL``, which ``tests.settings`` reads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test.utils import override_settings
from redis.cluster import RedisCluster

from tests.settings import REDIS_URL_ENV_VAR
from tests.support import server_facing
from tests.support.events import events_mode
from tests.support.forking import ForkedChild, fork_child
from tests.support.hygiene import release_left_holds, wait_for_loss_reports
from tests.support.postgres_servers import django_db_modify_db_settings, postgres_server  # noqa: F401
from tests.support.probe import SINGLE, Topology, topology_of
from tests.support.proxy import TcpProxy
from tests.support.redis_servers import RedisServer
from tests.support.servers import install_termination_cleanup
from tests.support.topologies import ClusterSetup, ReplicatedSetup, SentinelSetup

SHARED_DOWN_AFTER_MS = 60_000
"""How long the shared Sentinel and Cluster topologies wait before failing a primary over
(never, in a test run): the private ones, which tests fail over, wait 1 s."""

_SESSION_SERVER = pytest.StashKey[RedisServer]()
_CACHES_OVERRIDE = pytest.StashKey[override_settings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server-facing",
        action="store_true",
        help="run only the tests whose outcome can differ between servers, the engine's on "
        "the single server (tests/run.py's later passes; the rule: "
        "tests/support/server_facing.py)",
    )
    parser.addoption(
        "--chaos-more",
        action="store_true",
        help="also the short seeded chaos runs CI leaves out (tests/faults/test_chaos.py)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not config.getoption("--server-facing") or not collection_path.is_relative_to(
        config.rootpath
    ):
        return None
    path = str(collection_path.relative_to(config.rootpath))
    return None if server_facing.may_hold_server_facing(path) else True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--server-facing"):
        return
    kept, dropped = server_facing.split(items, str(config.rootpath))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    install_termination_cleanup()
    server = RedisServer().start()
    config.stash[_SESSION_SERVER] = server
    os.environ[REDIS_URL_ENV_VAR] = server.url
    caches = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": server.url}}
    override = override_settings(CACHES=caches)
    override.enable()
    config.stash[_CACHES_OVERRIDE] = override


def pytest_unconfigure(config: pytest.Config) -> None:
    override = config.stash.get(_CACHES_OVERRIDE, None)
    if override is not None:
        override.disable()
    server = config.stash.get(_SESSION_SERVER, None)
    if server is not None:
        server.stop()
    os.environ.pop(REDIS_URL_ENV_VAR, None)


@pytest.fixture(autouse=True)
def _no_lock_left_held() -> Iterator[None]:
    """Fail a test that leaves an auto-renewing lock held: by nobody (a dropped lock
    object, an ended thread or task), or by a lock object it never released: see
    ``tests/support/hygiene.py``."""
    yield
    left = release_left_holds()
    reported = wait_for_loss_reports()
    assert not left, f"the test left locks held: {', '.join(left)}"
    assert reported, "the loss reports the test queued did not run within 10 s"


@pytest.fixture(scope="session")
def redis_server(pytestconfig: pytest.Config) -> RedisServer:
    """The server shared by the whole run; ``CACHES["default"]`` points at it.

    Never kill, pause or restart it: use ``private_redis`` for that.
    """
    return pytestconfig.stash[_SESSION_SERVER]


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> Topology:
    """Where the test's locks live: the shared server, or the topology named by an
    indirect parametrisation. ``tests/engine/`` and ``tests/test_managers.py`` replace
    this fixture with ``every_topology`` (one run per topology)."""
    return topology_of(request, getattr(request, "param", SINGLE))


@pytest.fixture
def redis_client(topology: Topology) -> Iterator[redis.Redis | RedisCluster]:
    """A client for the test's topology (the shared server unless parametrised: see
    ``topology``), every primary flushed before the test."""
    topology.flushall()
    client = topology.probe()
    yield client
    client.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start extra private servers (``factory(["--hz", "100"], password="pw")``); all
    stopped afterwards."""
    servers: list[RedisServer] = []

    def start(extra_args: Sequence[str] = (), **options: Any) -> RedisServer:
        server = RedisServer(extra_args, **options)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def private_redis(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    """A dedicated, started server that the test may kill, restart or pause."""
    return redis_server_factory()


@pytest.fixture(scope="session")
def sentinel_setup() -> Iterator[SentinelSetup]:
    """A primary, a replica and three Sentinels (service ``mymaster``) shared by the run.

    Never fail it over, kill or pause anything (use ``private_sentinel``); flush it
    (``sentinel_setup.flushall()``) or use keys of your own. Its Sentinels wait a minute
    before they call the primary down: with the 1 s of a private setup, a loaded CI
    machine once stalled the primary long enough for a failover nobody asked for.
    """
    with SentinelSetup(down_after_ms=SHARED_DOWN_AFTER_MS) as setup:
        yield setup


@pytest.fixture
def private_sentinel() -> Iterator[SentinelSetup]:
    """A Sentinel setup of this test's own (about 2 s to start), for failovers."""
    with SentinelSetup() as setup:
        yield setup


@pytest.fixture(scope="session")
def cluster_setup() -> Iterator[ClusterSetup]:
    """A cluster of three primaries with a replica each, shared by the run.

    Never fail over, migrate slots, kill or pause anything (use ``private_cluster``);
    flush it (``cluster_setup.flushall()``) or use keys of your own. Its nodes wait a
    minute before they fail a primary over (see ``sentinel_setup``).
    """
    with ClusterSetup(node_timeout_ms=SHARED_DOWN_AFTER_MS) as setup:
        yield setup


@pytest.fixture
def private_cluster() -> Iterator[ClusterSetup]:
    """A cluster of this test's own (about 2 s to start), for failovers and slot
    migrations."""
    with ClusterSetup() as setup:
        yield setup


@pytest.fixture
def replicated_setup() -> Iterator[ReplicatedSetup]:
    """A primary with two replicas (plain replication) of this test's own, in sync."""
    with ReplicatedSetup(replicas=2) as setup:
        yield setup


@pytest.fixture
def event_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``event_writer(**options)``: a fresh ``BufferedEventWriter`` (by default flushed
    only when told, ``interval=3600``) installed as this process's writer, stopped
    afterwards, so that no event of another test is written during this one, nor this
    test's later."""
    from django_distlock.events import writer as eventwriter

    writers: list[eventwriter.BufferedEventWriter] = []
    previous = eventwriter.current_writer()
    if previous is not None:
        previous.flush(10)

    def install(**options: Any) -> eventwriter.BufferedEventWriter:
        options.setdefault("interval", 3600.0)
        writer = eventwriter.BufferedEventWriter(**options)
        monkeypatch.setattr(eventwriter, "_writer", writer)
        writers.append(writer)
        return writer

    yield install
    for writer in writers:
        writer.close(10)


@pytest.fixture
def make_proxy() -> Iterator[Callable[[RedisServer], TcpProxy]]:
    """``make_proxy(server)``: a :class:`TcpProxy` in front of ``server``, closed after
    the test."""
    proxies: list[TcpProxy] = []

    def make(server: RedisServer) -> TcpProxy:
        proxy = TcpProxy("127.0.0.1", server.port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def fork() -> Iterator[Callable[[Callable[[], Any]], ForkedChild[Any]]]:
    """``fork(func)``: run ``func`` in a forked child (see ``tests.support.forking``);
    children still running after the test are killed."""
    children: list[ForkedChild[Any]] = []

    def start(func: Callable[[], Any]) -> ForkedChild[Any]:
        child = fork_child(func)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()


@pytest.fixture
def events_off() -> Iterator[None]:
    """No lock events recorded during the test (``DISTLOCK["EVENTS"] = "off"``)."""
    with events_mode("off"):
        yield


@pytest.fixture
def hold() -> Iterator[contextlib.ExitStack]:
    """``hold.enter_context(distlock(...))``: locks released at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def dead_redis_url(private_redis: RedisServer) -> str:
    """The URL of a Redis server that was stopped: nothing answers there any more."""
    url = private_redis.url
    private_redis.stop()
    return url
