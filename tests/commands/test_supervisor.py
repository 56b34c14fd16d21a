"""``django_distlock.commands.supervisor``: a program run under an engine lock, without Django
(``tests/management/commands/test_distlock.py`` drives the same through
``manage.py distlock run``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_distlock.commands import supervisor
from django_distlock.commands.supervisor import (
    EXIT_LOST,
    EXIT_NOT_FOUND,
    FORWARDED_SIGNALS,
    LockedProgram,
    available_signals,
    exit_status,
    forward_signal,
)
from django_distlock.engine import Backend, Lock, LockNotAcquired
from tests.support import REPO_ROOT
from tests.support.engine import lock_key, python, stored_lock, wait_until
from tests.support.programs import WritingScript, writing_script
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


def _group_at_release(lock: Lock, script: WritingScript) -> list[bool]:
    """Whether the program's process group still had a process each time ``lock`` was
    released (``lock.release`` wrapped)."""
    alive: list[bool] = []
    release = lock.release

    def checked_release() -> None:
        try:
            os.killpg(script.process_group(), 0)
        except ProcessLookupError:
            alive.append(False)
        else:
            alive.append(True)
        release()

    lock.release = checked_release  # type: ignore[method-assign]
    return alive


@needs_posix
def test_a_lost_lock_stops_the_programs_whole_process_group(backend, redis_client, tmp_path):
    # The shell dies of SIGTERM at once; its child ignores it and is still writing: only
    # SIGKILL to the group after the grace period stops it, and only then may the lock go.
    script = writing_script(tmp_path, ignore_sigterm=True)
    lock = Lock("job", backend=backend, timeout=1, auto_renew=True)
    alive_at_release = _group_at_release(lock, script)

    def steal_once_writing() -> None:
        script.writer_pid()
        redis_client.delete(lock_key("job"))

    thief = threading.Thread(target=steal_once_writing)
    thief.start()
    try:
        status, reports = run(lock, script.command, grace=0.5)
        thief.join()
        assert status == EXIT_LOST
        assert "sending SIGKILL" in reports[1]
        assert alive_at_release == [False]
        assert not script.writer_exists()
        assert not script.still_writing()
    finally:
        script.kill_writer()


@needs_posix
def test_the_lock_is_held_until_the_programs_background_processes_end(
    backend, redis_client, tmp_path
):
    # The shell exits at once, its child writes on for about half a second and exits; the
    # child's zombie (reparented away from the shell) must be reaped, or the group
    # never ends.
    script = writing_script(tmp_path, then="exit 3", lines=25)
    lock = Lock("job", backend=backend, auto_renew=True)
    alive_at_release = _group_at_release(lock, script)
    try:
        status, reports = run(lock, script.command)
        assert (status, reports) == (3, [])  # the leader's exit status
        assert alive_at_release == [False]
        assert script.lines() == 25
        assert not script.writer_exists()
        assert stored_lock(redis_client, "job") is None
    finally:
        script.kill_writer()


needs_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER, /proc"
)


def _state_and_parent(pid: int) -> tuple[str, int]:
    """A process's state letter (``Z``: a zombie) and its parent's PID, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return fields[0], int(fields[1])


def _orphan(*, lives: float) -> tuple[subprocess.Popen[str], int]:
    """A shell (leading a process group of its own) that started ``sleep lives`` and has
    exited and been reaped: the sleep is an orphan of that group. Returns both."""
    shell = subprocess.Popen(
        ["sh", "-c", f"sleep {lives} >/dev/null 2>&1 & echo $!"],
        stdout=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    with shell:
        orphan = int(shell.communicate(timeout=10)[0])
    return shell, orphan


def _parent_of_an_orphan() -> int:
    """The parent PID of a process whose own parent has just exited."""
    _, orphan = _orphan(lives=5)
    try:
        return _state_and_parent(orphan)[1]
    finally:
        os.kill(orphan, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(orphan, 0)  # ours to reap when we adopted it


@needs_linux
def test_adopting_orphans_only_while_the_program_runs():
    with supervisor.adopting_orphans() as adopting:
        assert adopting
        assert _parent_of_an_orphan() == os.getpid()
    assert _parent_of_an_orphan() != os.getpid()  # the previous setting is back


@needs_linux
def test_a_group_whose_last_processes_are_our_zombies_is_gone():
    # A zombie is still a member of its group (killpg finds it) until its parent reaps
    # it; adopted, its parent is us.
    with supervisor.adopting_orphans():
        shell, orphan = _orphan(lives=0.5)
        assert supervisor.process_group_exists(shell.pid)  # the sleep still runs
        wait_until(lambda: _state_and_parent(orphan) == ("Z", os.getpid()))
        assert not supervisor.process_group_exists(shell.pid)
    assert not Path(f"/proc/{orphan}").exists()  # reaped


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
        from django_distlock.commands import supervisor
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
    forward_signal(child, signal.SIGINT, group=False)  # type: ignore[arg-type]
    forward_signal(child, signal.SIGTERM, group=False)  # type: ignore[arg-type]
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
    forward_signal(child, signal.SIGTERM, group=False)  # type: ignore[arg-type]
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
