"""``django_distlock.supervisor``: a program run under an engine lock, without Django
(``tests/management/commands/test_distlock.py`` drives the same through
``manage.py distlock run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator

import pytest
import redis

from django_distlock import supervisor
from django_distlock.engine import Backend, Lock, LockNotAcquired
from django_distlock.supervisor import (
    EXIT_LOST,
    EXIT_NOT_FOUND,
    FORWARDED_SIGNALS,
    LockedProgram,
    available_signals,
    exit_status,
    forward_signal,
)
from tests.support import REPO_ROOT
from tests.support.engine import lock_key, python, stored_lock, wait_until
from tests.support.redis_servers import RedisServer

needs_posix = pytest.mark.skipif(os.name != "posix", reason="POSIX process groups")


@pytest.fixture
def backend(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Backend]:
    """An engine backend on the shared (flushed) server: no Django settings involved."""
    client = redis_server.client()
    backend = Backend(client)
    yield backend
    backend.close()
    client.close()


def run(lock: Lock, program: list[str], grace: float = 5) -> tuple[int, list[str]]:
    reports: list[str] = []
    status = LockedProgram(lock, program, grace=grace, report=reports.append).run()
    return status, reports


def test_runs_the_program_under_the_lock_and_exits_with_its_status(
    backend, redis_server, redis_client, tmp_path
):
    seen = tmp_path / "seen"
    lock = Lock("job", backend=backend, auto_renew=True)
    status, reports = run(
        lock,
        python(f"""
            import os, redis
            held = redis.Redis.from_url({redis_server.url!r}).exists({lock_key("job")!r})
            open({str(seen)!r}, "w").write(
                f"{{os.environ['DISTLOCK_NAME']}} {{os.environ['DISTLOCK_FENCE']}} {{held}}"
            )
            raise SystemExit(3)
        """),
    )
    assert (status, reports) == (3, [])
    name, fence, held = seen.read_text().split()
    assert (name, held) == ("job", "1")
    assert int(fence) > 0
    assert stored_lock(redis_client, "job") is None  # released


def test_a_busy_lock_raises_without_starting_the_program(backend, tmp_path):
    started = tmp_path / "started"
    holder = Lock("job", backend=backend, auto_renew=False)
    assert holder.acquire(blocking=False)
    original = signal.getsignal(signal.SIGTERM)
    try:
        lock = Lock("job", backend=backend, blocking=False, auto_renew=True)
        with pytest.raises(LockNotAcquired):
            run(lock, python(f"open({str(started)!r}, 'w').close()"))
    finally:
        holder.release()
    assert not started.exists()
    assert signal.getsignal(signal.SIGTERM) is original  # handlers restored


def test_a_program_killed_by_a_signal_exits_128_plus_n(backend):
    lock = Lock("job", backend=backend, auto_renew=True)
    status, _ = run(lock, python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert status == 128 + signal.SIGKILL


def test_a_missing_program_exits_127_and_releases_the_lock(backend, redis_client, tmp_path):
    lock = Lock("job", backend=backend, auto_renew=True)
    status, reports = run(lock, [str(tmp_path / "no-such-program")])
    assert status == EXIT_NOT_FOUND
    assert reports[0].startswith("program not found:")
    assert stored_lock(redis_client, "job") is None


def test_a_lost_lock_stops_the_program(backend, redis_client):
    lock = Lock("job", backend=backend, timeout=1, auto_renew=True)
    program = python("""
        import time
        print("started", flush=True)
        time.sleep(60)
    """)

    def steal_once_started() -> None:
        wait_until(lambda: stored_lock(redis_client, "job") is not None)
        redis_client.delete(lock_key("job"))

    thief = threading.Thread(target=steal_once_started)
    thief.start()
    try:
        status, reports = run(lock, program, grace=5)
    finally:
        thief.join()
    assert status == EXIT_LOST
    assert "was lost; stopping the program" in reports[0]
    assert f"(program exit status {128 + signal.SIGTERM})" in reports[-1]


def test_exit_status():
    assert exit_status(0) == 0
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGTERM) == 128 + signal.SIGTERM


# -- portability --------------------------------------------------------------------------


def test_available_signals_skips_names_the_platform_lacks(monkeypatch):
    monkeypatch.delattr(signal, "SIGHUP")
    assert available_signals(["SIGINT", "SIGHUP", "SIGTERM"]) == (signal.SIGINT, signal.SIGTERM)


@needs_posix
def test_posix_forwards_the_four_signals():
    assert FORWARDED_SIGNALS == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def test_imports_without_django_on_a_platform_without_sighup_or_sigquit():
    code = """
        import signal, sys
        del signal.SIGHUP, signal.SIGQUIT
        from django_distlock import supervisor
        print(sorted(s.name for s in supervisor.FORWARDED_SIGNALS))
        print(sorted(m for m in sys.modules if m == "django" or m.startswith("django.")))
    """
    result = subprocess.run(
        python(code), cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.splitlines() == ["['SIGINT', 'SIGTERM']", "[]"]


class _WindowsLikeChild:
    """``Popen.send_signal`` on Windows: only SIGTERM can be sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_signal(self, signum: int) -> None:
        if signum != signal.SIGTERM:
            raise ValueError(f"Unsupported signal: {signum}")
        self.sent.append(signum)


def test_forward_signal_skips_signals_the_platform_cannot_send():
    child = _WindowsLikeChild()
    forward_signal(child, signal.SIGINT)  # type: ignore[arg-type]
    forward_signal(child, signal.SIGTERM)  # type: ignore[arg-type]
    assert child.sent == [signal.SIGTERM]


class _ReapedChild:
    """A program that exited and was reaped after the last look at it: its PID is gone."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def send_signal(self, signum: int) -> None:
        self.attempts.append(signum)
        raise ProcessLookupError(3, "No such process")


def test_forward_signal_to_a_program_that_has_exited():
    child = _ReapedChild()
    forward_signal(child, signal.SIGTERM)  # type: ignore[arg-type]
    assert child.attempts == [signal.SIGTERM]  # tried, and the ProcessLookupError swallowed


def _process_group_of_program(lock: Lock, tmp_path) -> tuple[int, int]:
    out = tmp_path / "groups"
    status, _ = run(
        lock,
        python(f"""
            import os
            open({str(out)!r}, "w").write(f"{{os.getpid()}} {{os.getpgrp()}}")
        """),
    )
    assert status == 0
    pid, group = out.read_text().split()
    return int(pid), int(group)


@needs_posix
def test_the_program_gets_a_process_group_of_its_own_on_posix(backend, tmp_path):
    assert supervisor.OWN_PROCESS_GROUP
    pid, group = _process_group_of_program(Lock("job", backend=backend), tmp_path)
    assert group == pid != os.getpgrp()


@needs_posix
def test_without_process_groups_the_program_shares_ours(backend, tmp_path, monkeypatch):
    # What every platform without ``process_group`` gets (the guard, tried on POSIX).
    monkeypatch.setattr(supervisor, "OWN_PROCESS_GROUP", False)
    pid, group = _process_group_of_program(Lock("job", backend=backend), tmp_path)
    assert group == os.getpgrp() != pid
