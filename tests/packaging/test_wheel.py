"""The built wheel installed as a user installs it: not editable, into a clean venv, with
its dependencies from the package index; the demo project then runs from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.packaging.conftest import Built
from tests.support import REPO_ROOT
from tests.support.redis_servers import RedisServer

# Building (an isolated build environment from the index) and installing into a new venv
# take minutes on a busy 2-core machine, and the fixtures count in the timeout.
pytestmark = pytest.mark.timeout(900)


# Run inside the demo's settings, from the installed wheel: the index page, then an invoice
# paid under its lock, which stores the lock's fence.
SMOKE_SCRIPT = r"""
import json
import django
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()
import django_distlock
from django.test import Client
from testproject.invoices.models import Invoice

client = Client()
invoice = Invoice.objects.order_by("number").first()
paid = client.post(f"/invoices/{invoice.pk}/pay/")
invoice.refresh_from_db()
print(json.dumps({
    "package": django_distlock.__file__,
    "version": django_distlock.__version__,
    "index": client.get("/").status_code,
    "pay": paid.status_code,
    "status": invoice.status,
    "fence": invoice.fence,
}))
"""


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with nothing but the wheel and the dependencies its metadata declares (from
    the package index): its Python."""
    home = tmp_path_factory.mktemp("wheel-venv")
    venv.create(home, with_pip=True, clear=True)
    python = home / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(built.wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return python


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    """The demo project and its ``manage.py``, away from the checkout, so that only the
    installed wheel can provide ``django_distlock``."""
    shutil.copytree(
        REPO_ROOT / "testproject",
        tmp_path / "testproject",
        ignore=shutil.ignore_patterns("db.sqlite3", ".redis", "__pycache__"),
    )
    shutil.copy(REPO_ROOT / "manage.py", tmp_path / "manage.py")
    return tmp_path


def test_the_wheel_installs_and_the_demo_runs_from_it(
    installed: Path,
    demo_copy: Path,
    built: Built,
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    env = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "REDIS_URL": redis_server_factory().url,
        "DEMO_DB": str(demo_copy / "demo.sqlite3"),
        "DEMO_PAY_SECONDS": "0",
    }

    def python(*args: str) -> str:
        result = subprocess.run(
            [installed, *args],
            cwd=demo_copy,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "System check identified no issues" in python("manage.py", "check")
    migrated = python("manage.py", "migrate", "--no-input")
    assert "Applying django_distlock.0001_initial... OK" in migrated
    assert "No changes detected" in python(
        "manage.py", "makemigrations", "--check", "--dry-run", "django_distlock"
    )

    smoke = json.loads(python("-c", SMOKE_SCRIPT).splitlines()[-1])
    site_packages = installed.parent.parent / "lib"
    assert Path(smoke["package"]).is_relative_to(site_packages), smoke["package"]
    assert built.wheel.name.startswith(f"django_distlock-{smoke['version']}-")
    assert smoke["index"] == 200
    assert smoke["pay"] in (200, 302), smoke
    assert smoke["status"] == "paid"
    assert smoke["fence"] >= 1


def test_the_wheel_is_not_the_checkout(installed: Path) -> None:
    """pip installed a copy, not a link to this checkout (an editable install would leave
    a ``direct_url.json`` saying ``editable``)."""
    result = subprocess.run(
        [installed, "-m", "pip", "show", "-f", "django-distlock"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Editable project location" not in result.stdout
    assert f"Location: {installed.parent.parent}" in result.stdout
    assert str(REPO_ROOT) not in result.stdout
