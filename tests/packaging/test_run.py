"""tests/run.py's choice of interpreter for the Django 6.0 pass, and its switches."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
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
    monkeypatch.setattr(run, "run", lambda *command, cwd: asked.append((command, cwd)))
    unpacked = run.unpack_source_package("python3.13", "trixie", tmp_path)
    assert asked == [(("apt-get", "source", "--download-only", "python3.13/trixie"), tmp_path)]
    assert unpacked == source
    assert (unpacked / "configure").is_file()
