"""``manage.py distlock``: list, show, release, run, prune-events."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_distlock import LockError, distlock
from django_distlock.commands.supervisor import (
    EXIT_BUSY,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
)
from django_distlock.models import HeldLock, LockEvent
from tests.support import REPO_ROOT
from tests.support.engine import (
    held_until_a_waiter_blocks,
    lock_key,
    python,
    stored_lock,
)
from tests.support.programs import writing_script

HOSTNAME = socket.gethostname()
THREAD = threading.current_thread().name


def distlock_cli(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("distlock", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_cli(*args: str) -> tuple[int, str]:
    """``distlock run ...`` in this process: its exit status and stderr."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as info:
        call_command("distlock", "run", *args, stdout=io.StringIO(), stderr=err)
    return info.value.code, err.getvalue()


def readline(stream: io.TextIOBase, timeout: float) -> str:
    """The next line of ``stream``, failing the test after ``timeout`` seconds."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    return lines.get(timeout=timeout)


# -- list -------------------------------------------------------------------------------


def test_list_without_locks(redis_client):
    out, err = distlock_cli("list")
    assert out == "No locks held.\n"
    assert err == ""  # the suite's server never evicts


def test_list_is_a_table_ordered_by_name(redis_client):
    with (
        distlock("report:b", context="manage.py report") as b,
        distlock("invoice:42", context="shop.views.pay", auto_renew=False, timeout=60) as a,
    ):
        fences = a.fence, b.fence
        out, _ = distlock_cli("list")
    header, rule, first, second, footer = out.splitlines()
    assert header.split() == [
        "NAME",
        "MODE",
        "HOLDER",
        "CONTEXT",
        "FENCE",
        "HELD",
        "FOR",
        "TTL",
        "AUTO-RENEW",
    ]
    assert set(rule) == {"-", " "}
    assert first.split() == [
        "invoice:42",
        "exclusive",
        f"{HOSTNAME}:{os.getpid()}",
        THREAD,
        "shop.views.pay",
        str(fences[0]),
        *first.split()[6:8],
        "no",
    ]
    assert re.fullmatch(r"\d+(\.\d)?s", first.split()[6])  # held for
    assert 50 <= int(first.split()[7].removesuffix("s")) <= 60  # TTL of a 60 s lease
    assert second.split()[0] == "report:b"
    assert second.split()[4:7] == ["manage.py", "report", str(fences[1])]
    assert second.split()[-1] == "yes"
    assert footer == "2 locks held."
    # Fixed width: every column starts at the same offset on every line.
    assert header.index("CONTEXT") == first.index("shop.views.pay") == second.index("manage.py")


EVICTION_WARNING = (
    "Warning: the lock server evicts keys (maxmemory-policy allkeys-lru): held locks can "
    "vanish. Use noeviction."
)


def test_list_warns_when_the_lock_server_evicts_keys(private_redis):
    private_redis.client().config_set("maxmemory-policy", "allkeys-lru")
    with override_settings(DISTLOCK={"URL": private_redis.url, "EVENTS": "off"}):
        out, err = distlock_cli("list")
        assert out == "No locks held.\n"
        assert err == EVICTION_WARNING + "\n"
        with distlock("invoice:42"):
            out, err = distlock_cli("list")
    assert out.splitlines()[-1] == "1 lock held."
    assert err == EVICTION_WARNING + "\n"


def test_list_says_nothing_of_eviction_it_cannot_read(private_redis):
    # A user who may not read the server's configuration still gets the listing.
    admin = private_redis.client()
    admin.config_set("maxmemory-policy", "allkeys-lru")
    admin.acl_setuser(
        "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config", "-info"]
    )
    url = private_redis.url.replace("redis://", "redis://app:pw@", 1)
    with override_settings(DISTLOCK={"URL": url, "EVENTS": "off"}), distlock("invoice:42"):
        out, err = distlock_cli("list")
    assert out.splitlines()[-1] == "1 lock held."
    assert err == ""


def test_list_prefix_filters(redis_client):
    with distlock("invoice:1"), distlock("invoice:2"), distlock("report:1"):
        out, _ = distlock_cli("list", "--prefix", "invoice:")
        assert [line.split()[0] for line in out.splitlines()[2:4]] == ["invoice:1", "invoice:2"]
        assert out.splitlines()[-1] == "2 locks held."
        out, _ = distlock_cli("list", "--prefix", "nothing:")
        assert out == "No locks held.\n"


def test_list_escapes_names_and_labels_for_the_terminal(redis_client):
    with distlock("evil\x1b[2J\u202ename", context="ctx\nline2"):
        out, _ = distlock_cli("list")
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert "evil\\x1b[2J\\u202ename" in out
    assert "ctx\\nline2" in out
    assert len(out.splitlines()) == 4


def test_list_cuts_long_names(redis_client):
    with distlock("x" * 300):
        out, _ = distlock_cli("list")
    row = out.splitlines()[2]
    assert row.startswith("x" * 47 + "…  ")


# -- show -------------------------------------------------------------------------------


def test_show_prints_every_field(redis_client):
    with distlock("invoice:42", context="shop.views.pay", timeout=45) as lock:
        fence = lock.fence
        out, _ = distlock_cli("show", "invoice:42")
        held = HeldLock.objects.get(name="invoice:42")
    fields = dict(line.split(": ", 1) for line in out.splitlines())
    assert {key: value.strip() for key, value in fields.items()} == {
        "name": "invoice:42",
        "mode": "exclusive",
        "host": HOSTNAME,
        "pid": str(os.getpid()),
        "thread": THREAD,
        "context": "shop.views.pay",
        "fence": str(fence),
        "acquired at": fields["acquired at"].strip(),
        "lease": "45s",
        "TTL remaining": fields["TTL remaining"].strip(),
        "auto-renew": "yes",
    }
    assert (
        fields["acquired at"]
        .strip()
        .startswith(held.acquired_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC ("))
    )
    assert 35 <= int(fields["TTL remaining"].strip().removesuffix("s")) <= 45


def test_show_a_lock_not_held(redis_client):
    with pytest.raises(CommandError, match="lock 'nope' is not held"):
        distlock_cli("show", "nope")


@pytest.mark.parametrize("subcommand", ["show", "release", "run"])
def test_an_empty_name_is_refused_as_empty(redis_client, subcommand):
    """Issue 27: ``show ''`` and ``release ''`` went to Redis with it ("cannot reach
    Redis" when it was down, "not held" when it was up)."""
    extra = {"show": [], "release": ["--force"], "run": ["--", "true"]}[subcommand]
    with pytest.raises(CommandError, match="lock name must not be empty"):
        distlock_cli(subcommand, "", *extra)


# -- release ----------------------------------------------------------------------------


def test_release_refuses_without_force(redis_client):
    with distlock("stuck") as lock:
        with pytest.raises(CommandError, match="refusing to release lock 'stuck' without --force"):
            distlock_cli("release", "stuck")
        assert lock.owned()


def test_release_force_breaks_the_lock(redis_client):
    lock = distlock("stuck", timeout=30)
    assert lock.acquire()
    out, _ = distlock_cli("release", "stuck", "--force")
    assert out.startswith(
        f"Released lock 'stuck' (held by {HOSTNAME}:{os.getpid()} MainThread since "
    )
    assert f"fence {lock.fence})" in out
    assert not redis_client.exists(lock_key("stuck"))
    with distlock("stuck", blocking=False):  # free for others at once
        pass
    assert not lock.owned()  # the evicted holder finds out


def test_release_a_lock_not_held(redis_client):
    with pytest.raises(CommandError, match="lock 'nope' is not held"):
        distlock_cli("release", "nope", "--force")


@pytest.mark.django_db
@override_settings(DISTLOCK={"EVENTS": "sync"})
def test_release_does_not_touch_a_lock_that_changed_hands(redis_client, monkeypatch):
    first = distlock("contested")
    assert first.acquire()
    second = distlock("contested")
    real_filter = HeldLock.objects.filter

    def filter_then_hand_over(**lookup):
        holds = list(real_filter(**lookup))  # the operator saw the first holder...
        first.release()  # ...which then released, and someone else took it
        assert second.acquire(blocking=False)
        return holds

    monkeypatch.setattr(HeldLock.objects, "filter", filter_then_hand_over)
    with pytest.raises(CommandError, match="changed hands or was released"):
        distlock_cli("release", "contested", "--force")
    assert second.owned()
    second.release()
    # "nothing was done", and the history agrees: no force_released row.
    assert not LockEvent.objects.filter(kind="force_released").exists()


# -- kinds: a hold per row ---------------------------------------------------------------


def test_list_and_show_every_hold_with_its_mode(redis_client):
    with (
        distlock("catalog", shared=True, context="reader") as first,
        distlock("catalog", shared=True, context="reader") as second,
        distlock("export", limit=3) as slot,
        distlock("invoice:42"),
    ):
        out, _ = distlock_cli("list")
        shown, _ = distlock_cli("show", "catalog")
        fences = sorted([first.fence, second.fence])
        slot_fence = slot.fence
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[2:-1]] == [
        ["catalog", "shared"],
        ["catalog", "shared"],
        ["export", "limited"],
        ["invoice:42", "exclusive"],
    ]
    assert lines[4].split()[2] == "1/3"
    assert sorted(int(line.split()[5]) for line in lines[2:4]) == fences
    assert slot_fence == int(lines[4].split()[5])  # "limited 1/3" is two words, no context
    assert lines[-1] == "3 locks held (4 holds)."
    assert shown.startswith("hold 1 of 2\nname:          catalog\nmode:          shared\n")
    assert "\n\nhold 2 of 2\n" in shown
    assert (
        sorted(int(line.split()[-1]) for line in shown.splitlines() if line.startswith("fence"))
        == fences
    )
    assert "token" not in shown


def test_release_of_a_shared_lock_names_its_holds_and_takes_a_fence(redis_client):
    lost = threading.Event()
    evicted = distlock("catalog", shared=True, timeout=30, raise_on_lost=False)
    kept = distlock("catalog", shared=True, timeout=30, on_lost=lambda lock: lost.set())
    assert evicted.acquire()
    assert kept.acquire()
    try:
        with pytest.raises(
            CommandError, match="lock 'catalog' has 2 holds \\(shared\\); pass --fence"
        ):
            distlock_cli("release", "catalog", "--force")
        with pytest.raises(CommandError, match="lock 'catalog' has no hold with fence 12"):
            distlock_cli("release", "catalog", "--force", "--fence", "12")
        out, _ = distlock_cli("release", "catalog", "--force", "--fence", str(evicted.fence))
        assert out.startswith("Released a shared hold of lock 'catalog' (held by ")
        assert f"fence {evicted.fence})" in out
        assert [held.token for held in HeldLock.objects.filter(name="catalog")] == [kept.token]
        assert kept.owned()
        assert not lost.is_set()
        # One hold left: no --fence needed.
        distlock_cli("release", "catalog", "--force")
        assert not HeldLock.objects.filter(name="catalog").exists()
    finally:
        for lock in (evicted, kept):
            with contextlib.suppress(LockError):
                lock.release()


def test_run_takes_a_slot_of_a_limited_lock(redis_client):
    with distlock("cron-job", limit=2):
        code, err = run_cli("cron-job", "--limit", "2", "--", *python("import sys; sys.exit(4)"))
        assert code == 4, err
        with distlock("cron-job", limit=2):
            code, err = run_cli("cron-job", "--limit", "2", "--", *python("pass"))
    assert code == EXIT_BUSY
    assert "is held by 2 holders (limited 2/2): " in err


def test_run_takes_a_shared_hold(redis_client):
    with distlock("cron-job", shared=True):
        code, err = run_cli("cron-job", "--shared", "--", *python("import sys; sys.exit(3)"))
    assert code == 3, err
    with pytest.raises(CommandError, match="invalid lock: limit must be between 1"):
        distlock_cli("run", "cron-job", "--limit", "0", "--", "true")


# -- run --------------------------------------------------------------------------------

UNDER_THE_LOCK = """
    import os, sys, redis
    from django_distlock.engine.keys import lock_key
    client = redis.Redis.from_url(os.environ["DISTLOCK_TEST_REDIS_URL"])
    value = client.get(lock_key("distlock:", os.environ["DISTLOCK_NAME"]))
    held = value is not None and value.split(b"\\n")[1].decode() == os.environ["DISTLOCK_FENCE"]
    client.close()
    sys.exit(int(sys.argv[1]) if held else 99)
"""


@pytest.mark.parametrize("status", [0, 3])
def test_run_exits_with_the_programs_status(redis_client, status):
    code, err = run_cli("cron-job", "--", *python(UNDER_THE_LOCK), str(status))
    assert code == status, err
    assert not redis_client.exists(lock_key("cron-job"))


def test_run_passes_the_programs_arguments_untouched(redis_client):
    argv = ["-x", "--", "--wait", "a b", "--"]
    code, err = run_cli(
        "cron-job",
        "--wait",
        "1",
        "--",
        *python(f"import sys; sys.exit(0 if sys.argv[1:] == {argv!r} else 1)"),
        *argv,
    )
    assert code == 0, err


def test_run_reports_a_program_killed_by_a_signal(redis_client):
    code, _ = run_cli("cron-job", "--", *python("import os, signal; os.kill(os.getpid(), 9)"))
    assert code == 128 + signal.SIGKILL


def test_run_busy_exits_75(redis_client):
    with distlock("cron-job"):
        code, err = run_cli("cron-job", "--", *python("raise SystemExit(0)"))
    assert code == EXIT_BUSY == 75
    assert f"lock 'cron-job' is held by {HOSTNAME}:{os.getpid()} MainThread since " in err
    assert "(use --wait to wait)" in err


def test_run_wait_runs_the_program_once_the_holder_releases(redis_client):
    with held_until_a_waiter_blocks(distlock("cron-job"), redis_client):
        code, err = run_cli("cron-job", "--wait", "20", "--", *python(UNDER_THE_LOCK), "4")
    assert code == 4, err


def test_run_signal_while_waiting_ends_run_without_starting_the_program(redis_client, tmp_path):
    marker = tmp_path / "started"
    original = signal.getsignal(signal.SIGTERM)

    def signal_run() -> None:
        # Only signal once run's handler is in place (else SIGTERM kills pytest).
        assert signal.getsignal(signal.SIGTERM) is not original
        os.kill(os.getpid(), signal.SIGTERM)

    with held_until_a_waiter_blocks(distlock("cron-job"), redis_client, then=signal_run):
        code, err = run_cli(
            "cron-job", "--wait", "20", "--", *python(f"open({str(marker)!r}, 'w').close()")
        )
    assert code == 128 + signal.SIGTERM
    assert "interrupted by signal 15 before the program started" in err
    assert not marker.exists()
    assert signal.getsignal(signal.SIGTERM) is original  # handlers restored
    assert not redis_client.exists(lock_key("cron-job"))


def test_run_wait_that_runs_out_exits_75(redis_client):
    with distlock("cron-job"):
        code, err = run_cli("cron-job", "--wait", "0.05", "--", *python("pass"))
    assert code == EXIT_BUSY
    assert "after waiting" in err


def test_run_program_not_found(redis_client):
    code, err = run_cli("cron-job", "--", "/nonexistent/program")
    assert code == EXIT_NOT_FOUND
    assert "program not found" in err
    assert not redis_client.exists(lock_key("cron-job"))


def test_run_a_program_whose_file_name_is_not_utf8(redis_client, tmp_path):
    # Its name reaches Python with surrogates (surrogateescape) and, with "distlock run "
    # before it, is longer than a context label may be.
    program = tmp_path / os.fsdecode(b"job-\xff-" + b"j" * 240)
    program.write_text("#!/bin/sh\nexit 5\n")
    program.chmod(0o755)
    code, err = run_cli("cron-job", "--", str(program))
    assert code == 5, err
    assert not redis_client.exists(lock_key("cron-job"))


def test_run_without_a_program(redis_client):
    with pytest.raises(CommandError, match="run needs a program"):
        distlock_cli("run", "cron-job")


def test_run_redis_down_exits_69(private_redis):
    url = private_redis.url
    private_redis.stop()
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        }
    }
    with override_settings(CACHES=caches):
        code, err = run_cli("cron-job", "--", *python("pass"))
    assert code == EXIT_UNAVAILABLE
    assert "Redis is unavailable" in err


def test_run_stops_the_program_when_the_lock_is_lost(redis_client, tmp_path):
    marker = tmp_path / "sigterm"
    # The program ignores SIGTERM (after noting it) and deletes its own lock, as an
    # operator's force-release or a Redis failover would.
    program = f"""
        import os, signal, time, redis
        signal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, "w").close())
        client = redis.Redis.from_url(os.environ["DISTLOCK_TEST_REDIS_URL"])
        client.delete({lock_key("lost-job")!r})
        client.close()
        time.sleep(60)
    """
    code, err = run_cli("lost-job", "--timeout", "0.9", "--grace", "0.5", "--", *python(program))
    assert code == EXIT_LOST == 70
    assert marker.exists()  # SIGTERM first...
    assert "sending SIGKILL" in err  # ...then SIGKILL after the grace period
    assert "lock 'lost-job' was lost while the program ran" in err
    assert f"(program exit status {128 + signal.SIGKILL})" in err


def test_sigterm_to_distlock_run_is_forwarded_to_the_program(redis_client, tmp_path):
    marker = tmp_path / "forwarded"
    program = f"""
        import signal, sys
        def stop(signum, frame):
            open({str(marker)!r}, "w").write(signal.Signals(signum).name)
            sys.exit(7)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        signal.pause()
    """
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "distlock",
            "run",
            "forwarding",
            "--settings",
            "tests.settings",
            "--",
            *python(program),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert readline(process.stdout, 30) == "ready\n"
            assert stored_lock(redis_client, "forwarding").owner["pid"] == process.pid
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 7
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)
    assert marker.read_text() == "SIGTERM"
    assert not redis_client.exists(lock_key("forwarding"))


@pytest.mark.skipif(os.name != "posix", reason="POSIX process groups")
def test_sigterm_to_distlock_run_stops_the_work_the_program_started(redis_client, tmp_path):
    # The program is a script whose child does the work: both must be gone before run
    # releases the lock and exits, or the next run would overlap with the child.
    script = writing_script(tmp_path)
    command = [sys.executable, "-m", "django", "distlock", "run", "nightly"]
    with subprocess.Popen(
        [*command, "--settings", "tests.settings", "--", *script.command],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            script.writer_pid()
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 128 + signal.SIGTERM  # the shell's status
            assert not script.writer_exists()
            assert not script.still_writing()
        finally:
            script.kill_writer()
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)
    assert not redis_client.exists(lock_key("nightly"))


# -- prune-events -----------------------------------------------------------------------


@pytest.mark.django_db
def test_prune_events_deletes_old_events(redis_client):
    now = timezone.now()
    for days in (40, 31, 29, 1):
        LockEvent.objects.create(name="x", kind="acquired", at=now - datetime.timedelta(days=days))
    out, _ = distlock_cli("prune-events", "--older-than", "30d")
    assert out == "Deleted 2 lock events older than 30d.\n"
    assert sorted((now - e.at).days for e in LockEvent.objects.filter(name="x")) == [1, 29]
    out, _ = distlock_cli("prune-events", "--older-than", "172800")
    assert out == "Deleted 1 lock event older than 2d.\n"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty duration"),
        ("-1d", "must not be negative"),
        ("5w", "unknown unit 'w'"),
        ("99999999999d", "too large"),
        ("12 parsecs", "invalid duration"),
    ],
)
def test_prune_events_rejects_bad_durations(value, message):
    with pytest.raises(CommandError, match=message):
        distlock_cli("prune-events", f"--older-than={value}")


def test_prune_events_requires_older_than():
    with pytest.raises(CommandError, match="--older-than"):
        distlock_cli("prune-events")


@pytest.mark.parametrize(
    "args",
    [["list", "--skip-checks"], ["--skip-checks", "list"], ["show", "nothing", "--skip-checks"]],
)
def test_skip_checks_is_accepted_like_every_django_command(redis_client, args):
    """``--skip-checks`` works with every Django command; ``distlock`` runs no checks
    anyway, so it accepts and ignores it, before or after the subcommand."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "distlock", *args, "--settings", "tests.settings"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "unrecognized arguments" not in result.stderr
    if args[0] == "show" or args[-1] == "show":
        assert "lock 'nothing' is not held" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
