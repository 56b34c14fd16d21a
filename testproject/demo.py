"""Set up and run the django-distlock demo: ``python3 testproject/demo.py``.

Creates ``.venv`` (if missing) with the project and its ``demo`` extra, starts a private
Redis server on a free loopback port unless ``REDIS_URL`` is set, migrates a SQLite
database, creates or resets the superuser ``admin`` with a freshly generated password,
and serves the site on http://127.0.0.1:8000/ (``PORT`` to change it). Ctrl-C stops
everything. Stdlib only until it re-runs itself inside the virtualenv.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.run import PYTHON, ensure_venv, run  # noqa: E402


def bootstrap() -> None:
    """Re-run this script with the virtualenv's Python once the project is installed."""
    if Path(sys.prefix).resolve() == PYTHON.parent.parent.resolve():
        return
    if sys.version_info < (3, 11):  # noqa: UP036 (run by whatever python3 is on PATH)
        sys.exit("testproject/demo.py needs Python 3.11 or newer.")
    ensure_venv()
    run(PYTHON, "-m", "pip", "install", "-q", "-e", ".[demo]")
    os.execv(PYTHON, [str(PYTHON), __file__, *sys.argv[1:]])  # noqa: S606


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


def main() -> None:
    bootstrap()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    server = None
    if not os.environ.get("REDIS_URL"):
        from tests.redis_servers import RedisServer, install_termination_cleanup

        install_termination_cleanup()
        server = RedisServer().start()
        os.environ["REDIS_URL"] = server.url
    try:
        manage("migrate", "--no-input", "-v", "0")
        password = create_superuser()
        port = os.environ.get("PORT", "8000")
        site = f"http://127.0.0.1:{port}"
        print(
            f"\ndjango-distlock demo (Redis at {os.environ['REDIS_URL']})\n"
            f"  guarded page:  {site}/\n"
            f"  admin:         {site}/admin/   user: admin   password: {password}\n"
            f"  commands:      REDIS_URL={os.environ['REDIS_URL']} .venv/bin/python manage.py "
            "close_books | hold_locks | distlock list\n",
            flush=True,
        )
        manage("runserver", "--noreload", f"127.0.0.1:{port}")
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
