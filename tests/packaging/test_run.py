"""tests/run.py's choice of interpreter for the Django 6.0 pass, and its switches."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from tests import run

THIS = "{}.{}".format(*sys.version_info[:2])


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An empty ``PATH`` directory, pyenv root and build prefix, in place of the real ones."""
    bindir, pyenv = tmp_path / "bin", tmp_path / "pyenv"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("PYENV_ROOT", str(pyenv))
    monkeypatch.setattr(run, "BUILT_PYTHON", tmp_path / "built" / "bin" / "python3.13")
    return {"bin": bindir, "pyenv": pyenv, "built": run.BUILT_PYTHON}


def test_an_interpreter_that_does_not_run_is_passed_over(places: dict[str, Path]) -> None:
    """A pyenv shim for a version pyenv does not have is on PATH and fails when run."""
    version = THIS
    shim = _script(places["bin"] / f"python{version}", "#!/bin/sh\nexit 127\n")
    real = places["pyenv"] / "versions" / f"{version}.99" / "bin" / f"python{version}"
    real.parent.mkdir(parents=True)
    real.symlink_to(sys.executable)
    assert run.python_candidates(version)[:2] == [str(shim), str(real)]
    assert run.python_version(shim) is None
    assert run.find_python(version) == str(real)


def test_an_interpreter_of_another_version_is_passed_over(places: dict[str, Path]) -> None:
    """A ``python3.X`` on PATH that is really this Python is not a 3.X."""
    other = "3.12" if THIS == "3.13" else "3.13"
    (places["bin"] / f"python{other}").symlink_to(sys.executable)
    assert run.python_candidates(other)[0] == str(places["bin"] / f"python{other}")
    assert run.find_python(other) is None


def test_the_built_interpreter_comes_after_path_and_pyenv(places: dict[str, Path]) -> None:
    places["built"].parent.mkdir(parents=True)
    places["built"].symlink_to(sys.executable)
    assert run.find_python(THIS) == str(places["built"])  # before this script's own Python
    on_path = places["bin"] / f"python{THIS}"
    on_path.symlink_to(sys.executable)
    assert run.find_python(THIS) == str(on_path)


def test_an_unknown_second_pass_is_refused_naming_the_choices() -> None:
    result = subprocess.run(
        [sys.executable, str(run.ROOT / "tests" / "run.py")],
        env={**os.environ, run.SECOND_PASS_ENV_VAR: "py399"},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "DISTLOCK_SECOND_PASS is one of py313, redis7" in result.stderr


def test_without_a_python_313_or_root_it_says_what_to_install(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match=r"install Python 3\.13 .*DISTLOCK_SECOND_PASS=redis7"):
        run.build_python313()


def test_the_upstream_tarball_is_unpacked_not_its_signature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``apt-get source`` leaves ``X.orig.tar.xz`` and its signature ``X.orig.tar.xz.asc``,
    which sorts after it (the first build tried to unpack the signature)."""
    source = tmp_path / "Python-3.13.5"
    _script(source / "configure", "#!/bin/sh\n")
    with tarfile.open(tmp_path / "python3.13_3.13.5.orig.tar.xz", "w:xz") as tarball:
        tarball.add(source, arcname=source.name)
    shutil.rmtree(source)
    (tmp_path / "python3.13_3.13.5.orig.tar.xz.asc").write_text("-----BEGIN PGP SIGNATURE")
    asked = []
    monkeypatch.setattr(run, "run", lambda *command, cwd, log=None: asked.append((command, cwd)))
    unpacked = run.unpack_source_package("python3.13", "trixie", tmp_path)
    assert asked == [(("apt-get", "source", "--download-only", "python3.13/trixie"), tmp_path)]
    assert unpacked == source
    assert (unpacked / "configure").is_file()


def test_a_background_step_runs_beside_the_caller_and_its_failure_is_raised_by_wait() -> None:
    started, release = threading.Event(), threading.Event()

    def step() -> None:
        started.set()
        release.wait(10)
        sys.exit("tests/run.py: make failed (2)")

    background = run.Background(step)
    assert started.wait(10)  # running while the caller goes on
    release.set()
    with pytest.raises(SystemExit, match="make failed"):
        background.wait()


@pytest.fixture
def no_second_python(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No Python 3.13 or 3.12 at hand, as root on Debian: ``plan`` must build one. The build
    is a stand-in, and so is ``ensure_venv_313``, which records the thread it ran in."""
    ran_in: list[str] = []
    monkeypatch.delenv(run.SERVER_ENV_VAR, raising=False)
    monkeypatch.setattr(run, "python_version", lambda python: None)  # no working venv
    monkeypatch.setattr(run, "find_second_python", lambda: None)
    monkeypatch.setattr(run, "build_python313", lambda: "built-python3.13")
    monkeypatch.setattr(run, "wheel_valkey", lambda: "valkey-server")
    monkeypatch.setattr(run.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(run.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        run, "ensure_venv_313", lambda python: ran_in.append(threading.current_thread().name)
    )
    return ran_in


def test_the_python_build_runs_beside_the_first_pass_and_the_second_waits_for_it(
    no_second_python: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython 3.13 is built while pass 1 runs (11 minutes that ``.ci/run`` could not add
    after it), and pass 2 starts only once the build has ended."""
    gate = threading.Event()
    monkeypatch.setattr(
        run, "build_python313", lambda: (gate.wait(10), no_second_python.append("built"))[1]
    )
    monkeypatch.setattr(run, "ensure_venv_313", lambda python: None)
    passes = run.plan([], "py313")
    assert passes[1].setup is not None
    started: list[tuple[Path, list[str]]] = []

    def fake_pytest(python: Path, args: list[str], binary: str, workers: list[str]) -> int:
        started.append((python, list(no_second_python)))
        gate.set()  # the build ends while the first pass runs
        return 0

    monkeypatch.setattr(run, "run_pytest", fake_pytest)
    monkeypatch.setattr(run, "describe", lambda python: "Python")
    monkeypatch.setattr(run, "server_version", lambda binary: "server")
    assert run.run_passes(passes, []) == 0
    assert started == [(run.PYTHON, []), (run.PYTHON_313, ["built"])]


def test_a_failed_build_fails_the_run_after_the_first_pass(
    no_second_python: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "build_python313", lambda: sys.exit("tests/run.py: make failed (2)"))
    passes = run.plan([], "py313")
    ran: list[Path] = []
    monkeypatch.setattr(run, "run_pytest", lambda python, *rest: ran.append(python) or 0)
    monkeypatch.setattr(run, "describe", lambda python: "Python")
    monkeypatch.setattr(run, "server_version", lambda binary: "server")
    with pytest.raises(SystemExit, match="make failed"):
        run.run_passes(passes, [])
    assert ran == [run.PYTHON]


def test_without_a_python_to_find_or_build_it_stops_before_the_first_pass(
    no_second_python: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match=r"install Python 3\.13"):
        run.plan([], "py313")
    assert no_second_python == []  # no build started


def test_with_a_python_at_hand_the_second_venv_is_ready_before_the_first_pass(
    no_second_python: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "find_second_python", lambda: "/usr/bin/python3.13")
    passes = run.plan([], "py313")
    assert passes[1].setup is None
    assert no_second_python == [threading.current_thread().name]
