"""Where ``demo.py`` leaves its private Redis server's URL, so that ``manage.py`` run from
another terminal finds that server without ``REDIS_URL``.

The file (``testproject/.redis/url``, or ``$DEMO_REDIS_URL_FILE``) holds the URL on its
first line and the server's PID on the second. ``read()`` ignores a file whose server
process is gone (a demo killed before it could remove the file), so a stale file is
harmless. Stdlib only: ``demo.py`` and ``settings.py`` both import it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DEMO_REDIS_URL_FILE"
DEFAULT_PATH = Path(__file__).resolve().parent / ".redis" / "url"


def path() -> Path:
    """The file's location: ``$DEMO_REDIS_URL_FILE``, else ``testproject/.redis/url``."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, but it exists
        return True
    return True


def _parse(text: str) -> tuple[str, int | None]:
    lines = text.split("\n")
    url = lines[0].strip()
    pid = lines[1].strip() if len(lines) > 1 else ""
    return url, int(pid) if pid.isdigit() else None


def read() -> str | None:
    """The URL in the file, or None if there is no file or its server has stopped."""
    try:
        url, pid = _parse(path().read_text())
    except (OSError, UnicodeDecodeError):
        return None
    if not url or (pid is not None and not _alive(pid)):
        return None
    return url


def write(url: str, pid: int) -> Path:
    """Record ``url``, served by process ``pid`` (atomically: readers never see half)."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_text(f"{url}\n{pid}\n")
    partial.replace(target)
    return target


def remove(url: str | None = None) -> None:
    """Delete the file if it holds ``url`` (when given; another demo may have replaced it
    since) or if its server has stopped."""
    target = path()
    try:
        current, pid = _parse(target.read_text())
    except (OSError, UnicodeDecodeError):
        return
    if current == url or (pid is not None and not _alive(pid)):
        target.unlink(missing_ok=True)
