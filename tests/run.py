"""Run the django-distlock test suite: ``python3 tests/run.py [pytest args...]``.

Creates ``.venv`` at the repository root if it is missing, installs the project
with its ``test`` extras into it (editable), then runs pytest from the repository
root with any extra arguments passed through. Exits with pytest's exit code,
except that "no tests collected" (5) counts as a failure and death by signal N
gives 128 + N, as in a shell. Stdlib only, so it runs on a fresh machine with
nothing but Python 3.11+ and pip.
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


def run_pytest(args: list[str]) -> int:
    """Run pytest and return its exit code.

    Ctrl-C reaches pytest directly (same process group); this process only waits,
    so pytest has time to stop its Redis servers.
    """
    with subprocess.Popen([PYTHON, "-m", "pytest", *args], cwd=ROOT) as pytest:
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
    code = run_pytest(args)
    if code < 0:
        return 128 - code
    return 1 if code == PYTEST_NO_TESTS_COLLECTED else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
