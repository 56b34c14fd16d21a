"""The pytest plugin as users meet it: loaded from the package's ``pytest11`` entry point
by a pytest run of another project's tests (the demo's, ``testproject/tests``), in a
child process. Nothing it starts outlives that run."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from django_distlock.testing import TEST_URL_ENV_VAR
from tests.settings import REDIS_URL_ENV_VAR

ROOT = Path(__file__).resolve().parents[2]
STARTED = re.compile(
    r"django-distlock: lock server \S+ \(pid (\d+), port (\d+)\) started in (\d+) ms"
)


def plugin_entry_point() -> None:
    """Fail (not skip) when the running environment lacks the entry point: the child
    pytest would run without the plugin."""
    found = entry_points(group="pytest11", name="django_distlock")
    if not found:
        pytest.fail(
            "the pytest11 entry point 'django_distlock' is not installed in "
            f"{sys.prefix}: reinstall the project (pip install -e '.[test]') so that "
            "pyproject.toml's [project.entry-points.pytest11] is registered"
        )
    assert [ep.value for ep in found] == ["django_distlock.testing.plugin"]


def user_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's pytest run: plugins autoloaded, none of this suite's
    settings, no server named, and temporary files in ``tmp_path/tmp`` (to see what is
    left there)."""
    ours = ("DJANGO_SETTINGS_MODULE", REDIS_URL_ENV_VAR, TEST_URL_ENV_VAR)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ours and not key.startswith("PYTEST_")
    }
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def processes_under(directory: Path) -> list[str]:
    """The command lines of the processes running with ``directory`` in them (our
    servers run with ``--dir`` in a temporary directory there)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if str(directory) in command:
            found.append(command)
    return found


def user_pytest(
    tmp_path: Path,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -p no:cacheprovider ARGS`` as a user runs it (:func:`user_env`),
    in ``cwd`` (default ``tmp_path``), killed after ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path if cwd is None else cwd,
        env=user_env(tmp_path) if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_the_demos_tests(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    result = user_pytest(tmp_path, "testproject/tests", *options, cwd=ROOT, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"\b9 passed\b", result.stdout), output
    assert processes_under(tmp_path / "tmp") == []  # nothing it started runs on
    # The servers' directories and logs are removed (pytest-xdist leaves its own there).
    assert list((tmp_path / "tmp").glob("distlock-*")) == []
    return result


def test_the_demos_tests_run_on_the_plugin_from_its_entry_point(tmp_path):
    plugin_entry_point()
    result = run_the_demos_tests(tmp_path, "-v")
    assert re.search(r"^plugins: .*django-distlock", result.stdout, re.MULTILINE), result.stdout
    started = STARTED.search(result.stdout)
    assert started, result.stdout
    pid, port, milliseconds = started.groups()
    assert int(milliseconds) < 1000  # the first use of distlock_server in a session
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)
    assert refused(int(port))


def test_the_demos_tests_run_under_xdist(tmp_path):
    """One server per worker (each worker is a session), a fresh prefix per test."""
    plugin_entry_point()
    run_the_demos_tests(tmp_path, "-n", "2")


KILLED_SESSION = """
import os
import signal


def test_the_session_is_killed(distlock_server):
    print("SERVER", distlock_server, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_session_takes_its_server_along(tmp_path):
    plugin_entry_point()
    (tmp_path / "test_killed.py").write_text(textwrap.dedent(KILLED_SESSION))
    result = user_pytest(tmp_path, "-s", "test_killed.py")
    assert result.returncode == -9, result.stdout + result.stderr
    url = re.search(r"SERVER (redis://\S+)", result.stdout)
    assert url, result.stdout + result.stderr
    port = int(url[1].rsplit(":", 1)[1].split("/")[0])
    deadline = time.monotonic() + 5
    while not refused(port) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert refused(port)
    # And its directory with it (issue 27: it stayed behind, a leak per killed session).
    leftovers = tmp_path / "tmp"
    while list(leftovers.glob("distlock-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(leftovers.glob("distlock-*")) == []


def test_nothing_starts_unless_a_test_asks(tmp_path):
    plugin_entry_point()
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    result = user_pytest(tmp_path, "-v", "test_plain.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "django-distlock" in result.stdout  # the plugin is loaded...
    assert "lock server" not in result.stdout  # ...and started nothing


def test_distlock_test_url_is_used_instead_of_a_server(tmp_path, redis_server):
    plugin_entry_point()
    (tmp_path / "test_url.py").write_text(
        "import os\n\n\ndef test_url(distlock_server):\n"
        "    assert distlock_server == os.environ['DISTLOCK_TEST_URL']\n"
    )
    env = {**user_env(tmp_path), TEST_URL_ENV_VAR: redis_server.url}
    result = user_pytest(tmp_path, "-v", "test_url.py", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lock server" not in result.stdout  # nothing started
