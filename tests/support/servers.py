"""Private server processes on free loopback ports: the process management shared by the
Redis (:mod:`tests.support.redis_servers`) and PostgreSQL
(:mod:`tests.support.postgres_servers`) harnesses, and through the first by ``bench/``.

A :class:`ServerProcess` runs in a private temporary directory with its output in
``server.log`` there. It counts as started once that log says the server is ready *and*
the process answering on the port is our child, so it never talks to a process that
took the port first (it then tries another free port). Servers still running are
stopped at interpreter exit, and killed on SIGTERM/SIGHUP once
:func:`install_termination_cleanup` was called. Django-free on purpose.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, ClassVar, Self

from django_distlock.testing.server import remove_when_process_ends

HOST = "127.0.0.1"
PORT_ATTEMPTS = 5
LOG_TAIL_CHARS = 4000

_live_servers: set[ServerProcess] = set()


class ServerError(RuntimeError):
    """A test server could not be found, started or reached."""


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def process_exists(pid: int) -> bool:
    """Whether a process with this PID exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def set_process_affinity(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (``sched_setaffinity`` on a PID
    only moves that one thread)."""
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def _die_with_parent() -> None:
    """In the server's child process: get SIGTERM when the process that started it dies
    (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)


class ServerProcess:
    """One server process of ours on a free loopback port.

    Subclasses say how to run the server (:meth:`_command`), which log line means it is
    ready (:attr:`ready_line`) and how to check that the server answering is our child
    (:meth:`_answers_as_our_process`). With ``die_with_parent`` the server gets SIGTERM
    if this process dies without stopping it (Linux); :meth:`pin` moves all its threads
    to some CPUs.
    """

    error: ClassVar[type[ServerError]] = ServerError
    ready_line: ClassVar[str]
    # Logged when the port was taken between choosing it and binding it.
    port_taken_lines: ClassVar[tuple[str, ...]] = ("Address already in use",)
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    stop_grace: ClassVar[float] = 5.0
    directory_prefix: ClassVar[str] = "distlock-server-"

    def __init__(self, *, startup_timeout: float, die_with_parent: bool = False) -> None:
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._dir: Path | None = None
        self._log_offset = 0
        self._paused = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        name = type(self).__name__ + self._repr_details()
        return f"<{name} port={self._port} pid={self.pid} {state}>"

    def _repr_details(self) -> str:
        return ""

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
    def program(self) -> str:
        """What runs, for error messages."""
        return type(self).__name__

    @property
    def port(self) -> int:
        """The TCP port, kept across ``kill()`` and ``restart()``."""
        if self._port is None:
            raise self.error(f"{type(self).__name__} has not been started.")
        return self._port

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

    def start(self) -> Self:
        """Start on a newly chosen free port; retry if another process takes it first."""
        if self.running:
            raise self.error(f"{self!r} is already running.")
        for _attempt in range(PORT_ATTEMPTS):
            if self._launch(self._choose_port()):
                return self
        raise self.error(
            f"Could not bind a free port after {PORT_ATTEMPTS} attempts.\n{self.log_tail()}"
        )

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port."""
        port = self.port
        if self.running:
            self._terminate()
        if not self._launch(port):
            raise self.error(f"Port {port} was taken while restarting.\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        """Ask the server to stop (:attr:`stop_signal`), SIGKILL it after
        :attr:`stop_grace` seconds; remove its directory."""
        self._terminate()
        self._remove()

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

    def pin(self, cpus: set[int]) -> None:
        """Run every thread of the server on ``cpus`` only."""
        if self._process is None or not self.running:
            raise self.error(f"{self!r} is not running.")
        set_process_affinity(self._process.pid, cpus)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the server log, headed by its path: for
        error messages."""
        path = self.log_path
        if path is None or not path.exists():
            return f"(no server log for {self!r})"
        text = path.read_text(errors="replace")
        return f"--- {path} ({self!r}) ---\n{text[-chars:]}"

    # What subclasses define.

    def _command(self, port: int) -> list[str]:
        """The command line that runs the server on ``port``."""
        raise NotImplementedError

    def _answers_as_our_process(self) -> bool:
        """Whether the server answering on our port is our child process."""
        raise NotImplementedError

    def _ready(self, log: str) -> bool:
        return self.ready_line in log

    def _choose_port(self) -> int:
        return free_port()

    def _make_directory(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=self.directory_prefix))

    def _before_launch(self) -> None:
        """Prepare the private directory for a launch."""

    def _popen_options(self) -> dict[str, Any]:
        return {}

    # The process itself.

    def _launch(self, port: int) -> bool:
        """Run the server on ``port``; False if the port was already in use."""
        if self._dir is None:
            self._dir = self._make_directory()
            if self.die_with_parent:  # its directory too
                remove_when_process_ends(self._dir)
        self._before_launch()
        assert self.log_path is not None
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                self._command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
                **self._popen_options(),
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
            log = self._log_since_launch()
            if self._process.poll() is not None:
                if any(line in log for line in self.port_taken_lines):
                    return False
                raise self.error(
                    f"{self.program} exited with code {self._process.returncode} during "
                    f"startup.\n{self.log_tail()}"
                )
            if self._ready(log) and self._answers_as_our_process():
                return True
            time.sleep(0.02)
        raise self.error(
            f"{self.program} did not start on port {self._port} within "
            f"{self.startup_timeout} s.\n{self.log_tail()}"
        )

    def _log_since_launch(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        with path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None or not self.running:
            raise self.error(f"{self!r} is not running.")
        self._process.send_signal(signum)

    def _terminate(self) -> None:
        self._ask_to_terminate()
        self._wait_terminated(time.monotonic() + self.stop_grace)

    def _ask_to_terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(self.stop_signal)
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

    def _remove(self) -> None:
        _live_servers.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def stop_all(servers: Iterable[ServerProcess] | None = None) -> None:
    """Stop ``servers`` (default: every server still running in this process) at once:
    the stop signal to all of them first, then wait, so N servers take as long as one.

    Each still gets its grace period before SIGKILL.
    """
    chosen = list(_live_servers if servers is None else servers)
    for server in chosen:
        server._ask_to_terminate()
    started = time.monotonic()
    for server in chosen:
        server._wait_terminated(started + server.stop_grace)
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
