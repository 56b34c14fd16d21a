"""The sdist and wheel a release uploads: built, checked by twine, with the right files
and metadata."""

from __future__ import annotations

import email.parser
import importlib.metadata
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest

import django_distlock
import noxfile
from tests.packaging.conftest import Built
from tests.support import REPO_ROOT

# Building (an isolated build environment from the index) and installing into a new venv
# take minutes on a busy 2-core machine, and the fixtures count in the timeout.
pytestmark = pytest.mark.timeout(900)


def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _wheel_metadata(built: Built) -> email.message.Message:
    with zipfile.ZipFile(built.wheel) as wheel:
        (name,) = (n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(wheel.read(name).decode())


def test_twine_check_strict_passes(built: Built) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_version_is_the_projects_everywhere(built: Built) -> None:
    version = _project()["version"]
    assert built.wheel.name == f"django_distlock-{version}-py3-none-any.whl"
    assert built.sdist.name == f"django_distlock-{version}.tar.gz"
    assert _wheel_metadata(built)["Version"] == version
    assert django_distlock.__version__ == importlib.metadata.version("django-distlock")
    assert django_distlock.__version__ == version  # the installed checkout is this one
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {version} " in changelog, f"CHANGELOG.md has no section for {version}"


def test_the_wheel_has_every_file_of_the_package_and_nothing_else(built: Built) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "django_distlock"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
    assert set(tracked) - names == set()  # templates, static files and py.typed included
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"django_distlock", f"django_distlock-{_project()['version']}.dist-info"}


def test_the_sdist_has_what_the_wheel_is_built_from(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "django_distlock/__init__.py"} <= names


def test_classifiers_name_only_the_versions_the_matrix_tests(built: Built) -> None:
    classifiers = _wheel_metadata(built).get_all("Classifier")
    pythons = {
        c.rsplit(" ", 1)[1]
        for c in classifiers
        if c.startswith("Programming Language :: Python :: 3.")
    }
    djangos = {c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: ")}
    assert pythons == set(noxfile.DJANGO)
    assert djangos == {
        requirement.split(">=", 1)[1].split(",", 1)[0] for requirement in noxfile.DJANGO.values()
    }


def test_the_metadata_names_no_address(built: Built) -> None:
    """The project has no public repository or home page yet: no address that does not
    exist (issue 30)."""
    metadata = _wheel_metadata(built)
    assert metadata.get_all("Project-URL") is None
    assert metadata.get("Home-page") is None
    assert "github.com/django-distlock" not in metadata.get_payload()
