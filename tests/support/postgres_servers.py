"""A private PostgreSQL cluster for the test suite, and the pytest fixtures using it.

``PostgresServer`` runs Debian's ``postgres`` (``/usr/lib/postgresql/*/bin``) on a free
loopback port, with its data directory and unix socket in a private temporary
directory, trust authentication and no durability (``fsync=off``): a scratch database
that disappears with the test run. PostgreSQL refuses to run as root, so when we are
root the cluster runs as ``nobody``.

The fixtures start it only when a collected test asks for the ``pg`` database alias
(``@pytest.mark.django_db(databases=["default", "pg"])``) and point that alias of
``tests.settings`` at it before pytest-django creates the test databases. They are
imported into ``tests/conftest.py``, which makes them override pytest-django's own
``django_db_modify_db_settings``.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from tests.support.redis_servers import HOST, _free_port

PG_ALIAS = "pg"
SUPERUSER = "postgres"
_PORT_ATTEMPTS = 5
_READY_LINE = "database system is ready to accept connections"
_LOG_TAIL_CHARS = 4000

_live_servers: set[PostgresServer] = set()


class PostgresServerError(RuntimeError):
    """The test PostgreSQL cluster could not be found, created or started."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres`` (newest Debian version first,
    then whatever ``pg_config --bindir`` or ``PATH`` says)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        reverse=True,
    )
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(found.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    raise PostgresServerError(
        "PostgreSQL is not installed: no initdb/postgres found in /usr/lib/postgresql/*/bin "
        "or on PATH. `python3 tests/run.py` installs Debian's `postgresql` when run as root."
    )


class PostgresServer:
    """A private PostgreSQL cluster on a free loopback port (superuser ``postgres``,
    trust authentication). Clusters still running at interpreter exit are stopped.

    >>> with PostgresServer() as server:          # doctest: +SKIP
    ...     server.port
    """

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.bin_dir = find_bin_dir()
        self.startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_offset = 0

    def __repr__(self) -> str:
        return f"<PostgresServer port={self._port} running={self.running}>"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise PostgresServerError("The cluster has not been started.")
        return self._port

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "server.log" if self._dir else None

    def settings(self, name: str = "distlock") -> dict[str, Any]:
        """A Django ``DATABASES`` entry for database ``name`` on this cluster."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": SUPERUSER,
            "PASSWORD": "",
            "HOST": HOST,
            "PORT": str(self.port),
        }

    def _user_options(self) -> dict[str, Any]:
        # initdb and postgres refuse to run as root.
        if os.geteuid() != 0:
            return {}
        nobody = pwd.getpwnam("nobody")
        return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}

    def start(self) -> Self:
        """Create the cluster in a temporary directory and start it."""
        if self.running:
            raise PostgresServerError(f"{self!r} is already running.")
        user = self._user_options()
        # As root, under /tmp: $TMPDIR may be a directory "nobody" cannot enter.
        parent = "/tmp" if user and os.path.isdir("/tmp") else None
        self._dir = Path(tempfile.mkdtemp(prefix="distlock-postgres-", dir=parent))
        if user:
            shutil.chown(self._dir, user["user"], user["group"])
        data = self._dir / "data"
        initdb = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata",
                str(data),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            cwd=self._dir,
            **user,
        )
        if initdb.returncode != 0:
            output = initdb.stdout + initdb.stderr
            self.stop()
            raise PostgresServerError(f"initdb failed ({initdb.returncode}):\n{output}")
        for _attempt in range(_PORT_ATTEMPTS):
            if self._launch(_free_port()):
                return self
        raise PostgresServerError(
            f"Could not bind a free port after {_PORT_ATTEMPTS} attempts.\n{self._log_tail()}"
        )

    def _launch(self, port: int) -> bool:
        assert self._dir is not None
        assert self.log_path is not None
        log_path = self.log_path
        with log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                [
                    str(self.bin_dir / "postgres"),
                    "-D",
                    str(self._dir / "data"),
                    "-p",
                    str(port),
                    "-k",
                    str(self._dir),
                    "-c",
                    f"listen_addresses={HOST}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=40",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                **self._user_options(),
            )
        user = self._user_options()
        if user:
            shutil.chown(log_path, user["user"], user["group"])
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
                if "could not bind" in log or "Address already in use" in log:
                    return False
                raise PostgresServerError(
                    f"postgres exited with code {self._process.returncode} during startup."
                    f"\n{self._log_tail()}"
                )
            if _READY_LINE in log and self._answers_as_our_process():
                return True
            time.sleep(0.05)
        raise PostgresServerError(
            f"postgres did not start on port {self._port} within {self.startup_timeout} s."
            f"\n{self._log_tail()}"
        )

    def _answers_as_our_process(self) -> bool:
        """Connect, and check that the postmaster answering is our child."""
        import psycopg

        assert self._process is not None
        try:
            with psycopg.connect(
                host=HOST, port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2
            ) as connection:
                row = connection.execute("SELECT pg_read_file('postmaster.pid', 0, 20)").fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0].split("\n", 1)[0] == str(self._process.pid)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGKILL after a grace period; remove the files."""
        self._terminate()
        _live_servers.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_since_launch(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        with path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def _log_tail(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no server log)"
        return f"--- {path} ---\n{path.read_text(errors='replace')[-_LOG_TAIL_CHARS:]}"


def _stop_all() -> None:
    for server in list(_live_servers):
        server.stop()


atexit.register(_stop_all)


def _uses_postgres(items: list[pytest.Item]) -> bool:
    for item in items:
        marker = item.get_closest_marker("django_db")
        databases = marker.kwargs.get("databases") if marker else None
        if databases == "__all__" or (databases is not None and PG_ALIAS in databases):
            return True
    return False


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer | None]:
    """The suite's PostgreSQL cluster, started only if a collected test uses the ``pg``
    database alias (``None`` otherwise)."""
    if not _uses_postgres(request.session.items):
        yield None
        return
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None,
    postgres_server: PostgresServer | None,
) -> None:
    """Point the ``pg`` alias at the suite's cluster before pytest-django creates the
    test databases (``django.db.connections`` reads these dicts when it first connects).
    """
    if postgres_server is None:
        return
    from django.conf import settings
    from django.db import connections

    settings.DATABASES[PG_ALIAS].update(postgres_server.settings())
    # A connection object made from the dummy settings would keep them: drop it.
    if hasattr(connections._connections, PG_ALIAS):
        del connections[PG_ALIAS]
