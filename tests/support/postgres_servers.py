"""A private PostgreSQL cluster for the test suite, and the pytest fixtures using it.

``PostgresServer`` runs Debian's ``postgres`` (``/usr/lib/postgresql/*/bin``) on a free
loopback port, with its data directory and unix socket in a private temporary
directory, trust authentication and no durability (``fsync=off``): a scratch database
that disappears with the test run. PostgreSQL refuses to run as root, so when we are
root the cluster runs as ``nobody``. Starting, stopping and cleaning up are
:mod:`tests.support.servers`'s, shared with the Redis harness.

The fixtures start it only when a collected test asks for the ``pg`` database alias
(``@pytest.mark.django_db(databases=["default", "pg"])``) and point that alias of
``tests.settings`` at it before pytest-django creates the test databases. They are
imported into ``tests/conftest.py``, which makes them override pytest-django's own
``django_db_modify_db_settings``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from tests.support.servers import HOST, ServerError, ServerProcess

PG_ALIAS = "pg"
SUPERUSER = "postgres"


class PostgresServerError(ServerError):
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


class PostgresServer(ServerProcess):
    """A private PostgreSQL cluster on a free loopback port (superuser ``postgres``,
    trust authentication). Clusters still running at interpreter exit are stopped.

    >>> with PostgresServer() as server:          # doctest: +SKIP
    ...     server.port
    """

    error = PostgresServerError
    ready_line = "database system is ready to accept connections"
    port_taken_lines = ("could not bind", "Address already in use")
    # Fast shutdown: roll back open transactions, end the sessions, stop.
    stop_signal = signal.SIGINT
    stop_grace = 10.0
    directory_prefix = "distlock-postgres-"

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.bin_dir = find_bin_dir()
        super().__init__(startup_timeout=startup_timeout)

    @property
    def program(self) -> str:
        return str(self.bin_dir / "postgres")

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

    def start(self) -> Self:
        """Create the cluster in a temporary directory and start it."""
        if self.running:
            raise PostgresServerError(f"{self!r} is already running.")
        self._dir = self._make_directory()
        initdb = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata",
                str(self._dir / "data"),
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
            **self._popen_options(),
        )
        if initdb.returncode != 0:
            output = initdb.stdout + initdb.stderr
            self.stop()
            raise PostgresServerError(f"initdb failed ({initdb.returncode}):\n{output}")
        return super().start()

    def _popen_options(self) -> dict[str, Any]:
        # initdb and postgres refuse to run as root.
        if os.geteuid() != 0:
            return {}
        nobody = pwd.getpwnam("nobody")
        return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}

    def _make_directory(self) -> Path:
        user = self._popen_options()
        # As root, under /tmp: $TMPDIR may be a directory "nobody" cannot enter.
        parent = "/tmp" if user and os.path.isdir("/tmp") else None
        directory = Path(tempfile.mkdtemp(prefix=self.directory_prefix, dir=parent))
        if user:
            shutil.chown(directory, user["user"], user["group"])
        return directory

    def _command(self, port: int) -> list[str]:
        assert self._dir is not None
        return [
            self.program,
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
        ]

    def _answers_as_our_process(self) -> bool:
        """Connect, and check that the postmaster answering is our child."""
        import psycopg  # only here: the Redis-only runs never need it

        assert self._process is not None
        try:
            with psycopg.connect(
                host=HOST, port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2
            ) as connection:
                row = connection.execute("SELECT pg_read_file('postmaster.pid', 0, 20)").fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0].split("\n", 1)[0] == str(self._process.pid)


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
