"""``manage.py distlock``: see and break held locks, run programs under a lock, prune events.

::

    manage.py distlock list [--prefix P]
    manage.py distlock show NAME
    manage.py distlock release NAME --force
    manage.py distlock run NAME [--wait S] [--timeout S] [--grace S] -- CMD ARGS...
    manage.py distlock prune-events --older-than DURATION

Exit status of ``run`` (a cluster-wide ``flock(1)`` for cron): the program's own exit
status; ``128 + N`` if it was killed by signal N; ``75`` (``EX_TEMPFAIL``) if the lock
stayed busy; ``69`` (``EX_UNAVAILABLE``) if Redis could not be reached; ``70``
(``EX_SOFTWARE``) if the lock was lost while the program ran (the program was stopped);
``127`` if the program was not found and ``126`` if it could not be executed. The other
subcommands exit with ``0`` on success and ``1`` on any error (a ``CommandError``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_distlock.commands import (
    escape_for_terminal,
    format_duration,
    holder_description,
    parse_duration,
    seconds_type,
    utc_timestamp,
)
from django_distlock.engine import Lock
from django_distlock.engine.exceptions import LockBackendUnavailable, LockError, LockLost
from django_distlock.engine.keys import clean_label, validate_name
from django_distlock.heldlocks import lock_server_eviction_policy

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "FORWARDED_SIGNALS",
    "Command",
]

EXIT_UNAVAILABLE = 69
"""``run``: Redis could not be reached (``EX_UNAVAILABLE``); the program did not run."""
EXIT_LOST = 70
"""``run``: the lock was lost while the program ran (``EX_SOFTWARE``)."""
EXIT_BUSY = 75
"""``run``: the lock stayed busy (``EX_TEMPFAIL``: cron may simply try again later)."""
EXIT_CANNOT_EXECUTE = 126
"""``run``: the program exists but could not be executed (as in a shell)."""
EXIT_NOT_FOUND = 127
"""``run``: the program was not found (as in a shell)."""

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals ``run`` passes on to the program."""

_COLUMN_LIMITS = {"NAME": 48, "HOLDER": 40, "CONTEXT": 32}
_RIGHT_ALIGNED = frozenset({"FENCE", "HELD FOR", "TTL"})


def _display_width(text: str) -> int:
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def _fit(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` terminal cells, ending with ``…`` when cut."""
    if _display_width(text) <= limit:
        return text
    kept, width = [], 0
    for char in text:
        char_width = _display_width(char)
        if width + char_width > limit - 1:
            break
        kept.append(char)
        width += char_width
    return "".join(kept) + "…"


def _pad(text: str, width: int, *, right: bool) -> str:
    fill = " " * (width - _display_width(text))
    return fill + text if right else text + fill


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a fixed-width table (cells already escaped for a terminal); wide
    columns are capped and cut with ``…``."""
    cells = [
        [_fit(cell, _COLUMN_LIMITS.get(h, 1_000)) for h, cell in zip(headers, row, strict=True)]
        for row in rows
    ]
    widths = [
        max([_display_width(header)] + [_display_width(row[i]) for row in cells])
        for i, header in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            _pad(value, width, right=header in _RIGHT_ALIGNED)
            for header, value, width in zip(headers, values, widths, strict=True)
        ).rstrip()

    return [line(headers), line(["-" * width for width in widths])] + [line(r) for r in cells]


class _SubcommandParser(CommandParser):
    """The parser of each subcommand. For ``run`` it splits the arguments at the first
    ``--`` itself: argparse would also drop any later ``--`` from the program's own
    arguments (``run NAME -- git log -- file``)."""

    program_dest: str | None = None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.program_dest is None or args is None or "--" not in args:
            return super().parse_known_args(args, namespace)
        args = list(args)
        split = args.index("--")
        namespace, extras = super().parse_known_args(args[:split], namespace)
        before = getattr(namespace, self.program_dest, None) or []
        setattr(namespace, self.program_dest, [*before, *args[split + 1 :]])
        return namespace, extras


def _django_options() -> argparse.ArgumentParser:
    """Django's own options, accepted after the subcommand too (``distlock list
    --settings=...``), and left alone when not given there."""
    options = argparse.ArgumentParser(add_help=False)
    hidden: dict[str, Any] = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    options.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], **hidden)
    options.add_argument("--settings", **hidden)
    options.add_argument("--pythonpath", **hidden)
    for flag in ("--traceback", "--no-color", "--force-color"):
        options.add_argument(flag, action="store_true", **hidden)
    return options


def _older_than(text: str) -> datetime.timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextlib.contextmanager
def _redis_errors() -> Iterator[None]:
    """Turn an unreachable or misconfigured Redis into a ``CommandError``."""
    try:
        yield
    except LockBackendUnavailable as exc:
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        raise CommandError(f"cannot reach Redis: {detail}") from exc
    except ImproperlyConfigured as exc:
        raise CommandError(f"django-distlock is misconfigured: {exc}") from exc


class _Interrupted(BaseException):
    """A forwarded signal arrived before the program started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _ProgramRun:
    """``distlock run``: one program under one lock, signals passed on, lease watched."""

    def __init__(
        self,
        *,
        write_error: Callable[[str], None],
        name: str,
        program: list[str],
        wait: float,
        timeout: float | None,
        grace: float,
    ) -> None:
        self.write_error = write_error
        self.name = name
        self.program = program
        self.wait = wait
        self.grace = grace
        self.child: subprocess.Popen[bytes] | None = None
        self.acquiring = True
        self.pending: list[int] = []
        self.exited = threading.Event()
        self.lost = threading.Event()
        self.done = threading.Event()  # the program exited or the lock was lost
        from django_distlock.locks import distlock

        self.lock = distlock(
            name,
            timeout=timeout,
            blocking=wait > 0,
            blocking_timeout=wait,
            auto_renew=True,
            on_lost=self._on_lost,
            context=clean_label(f"distlock run {os.path.basename(program[0])}"),
        )

    def _error(self, message: str) -> None:
        self.write_error(f"distlock run: {message}")

    def _on_lost(self, lock: Lock) -> None:
        self.lost.set()
        self.done.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.acquiring:
            raise _Interrupted(signum)
        child = self.child
        if child is None:
            self.pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    def run(self) -> int:
        """Run the program under the lock; return the exit status ``run`` exits with."""
        previous: dict[int, Any] = {}
        try:
            for signum in FORWARDED_SIGNALS:
                previous[signum] = signal.signal(signum, self._on_signal)
        except ValueError:
            pass  # not the main thread (call_command from a thread): nothing to forward
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _run(self) -> int:
        started = time.monotonic()
        try:
            try:
                acquired = self.lock.acquire()
            finally:
                self.acquiring = False
        except _Interrupted as interrupted:
            self._release_quietly()
            self._error(f"interrupted by signal {interrupted.signum} before the program started")
            return 128 + interrupted.signum
        except LockBackendUnavailable as exc:
            self._error(f"cannot take lock {self.name!r}, Redis is unavailable: {exc}")
            return EXIT_UNAVAILABLE
        except ImproperlyConfigured as exc:
            self._error(f"cannot take lock {self.name!r}: {exc}")
            return EXIT_UNAVAILABLE
        if not acquired:
            holder = holder_description(self.name)
            waited = (
                f" after waiting {format_duration(time.monotonic() - started)}"
                if self.wait > 0
                else ""
            )
            who = f"held by {holder}" if holder else "held by another process"
            self._error(
                f"lock {self.name!r} is {who}{waited}; not running {self.program[0]!r}"
                + ("" if self.wait > 0 else " (use --wait to wait)")
            )
            return EXIT_BUSY
        return self._supervise()

    def _supervise(self) -> int:
        if self.pending:
            self._release_quietly()
            self._error(f"interrupted by signal {self.pending[0]} before the program started")
            return 128 + self.pending[0]
        env = {**os.environ, "DISTLOCK_NAME": self.name, "DISTLOCK_FENCE": str(self.lock.fence)}
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            # Its own process group: a terminal's Ctrl-C reaches the program once, through
            # us, rather than twice.
            child = subprocess.Popen(self.program, env=env, process_group=0)
        except FileNotFoundError as exc:
            self._release_quietly()
            self._error(f"program not found: {exc}")
            return EXIT_NOT_FOUND
        except OSError as exc:
            self._release_quietly()
            self._error(f"cannot execute the program: {exc}")
            return EXIT_CANNOT_EXECUTE
        self.child = child
        for signum in self.pending:  # arrived while the program was starting
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        threading.Thread(target=self._reap, name="distlock-run-reaper", daemon=True).start()
        self.done.wait()
        if not self.exited.is_set():
            self._stop_program(child)
        status = child.returncode
        code = 128 - status if status < 0 else status
        try:
            self.lock.release()
        except LockLost:
            self.lost.set()
        except LockError as exc:
            self._error(f"could not release lock {self.name!r} (it expires with its lease): {exc}")
        if self.lost.is_set():
            self._error(
                f"lock {self.name!r} was lost while the program ran, so another process may "
                f"have run at the same time (program exit status {code})"
            )
            return EXIT_LOST
        return code

    def _reap(self) -> None:
        assert self.child is not None
        self.child.wait()
        self.exited.set()
        self.done.set()

    def _stop_program(self, child: subprocess.Popen[bytes]) -> None:
        self._error(
            f"lock {self.name!r} was lost; stopping the program (pid {child.pid}) with SIGTERM"
        )
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        if not self.exited.wait(self.grace):
            self._error(f"the program did not stop within {self.grace:g}s; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            self.exited.wait()

    def _release_quietly(self) -> None:
        if self.lock.token is not None:
            with contextlib.suppress(LockError):
                self.lock.release()


class Command(BaseCommand):
    """``manage.py distlock <subcommand>``: operate on the locks of the ``DISTLOCK``
    settings. Only locks under the configured key prefix are ever read or released."""

    help = "Inspect, break and use django-distlock locks: list, show, release, run, prune-events."
    # Operators need it most when something is wrong, so it does not stop at failed checks.
    requires_system_checks: ClassVar[list[str]] = []

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(
            dest="subcommand",
            required=True,
            metavar="SUBCOMMAND",
            parser_class=_SubcommandParser,
        )
        common = [_django_options()]
        listing = subcommands.add_parser(
            "list",
            parents=common,
            help="held locks as a table, ordered by name",
            description="Held locks.",
        )
        listing.add_argument("--prefix", default="", help="only locks whose name starts so")

        show = subcommands.add_parser(
            "show", parents=common, help="everything known about one held lock"
        )
        show.add_argument("name", metavar="NAME", help="the lock's name")

        release = subcommands.add_parser(
            "release",
            parents=common,
            help="force-release a held lock",
            description="Force-release a lock held by someone else. Its holder keeps running "
            "until its lease renewal notices (it is told the lock was lost).",
        )
        release.add_argument("name", metavar="NAME", help="the lock's name")
        release.add_argument("--force", action="store_true", help="really release it (required)")

        run = subcommands.add_parser(
            "run",
            parents=common,
            usage="%(prog)s NAME [--wait S] [--timeout S] [--grace S] -- CMD [ARGS ...]",
            help="run a program under a lock (a cluster-wide flock for cron)",
            description="Run CMD under lock NAME and exit with its exit status. Exit status "
            f"{EXIT_BUSY} if the lock is busy, {EXIT_UNAVAILABLE} if Redis is unreachable, "
            f"{EXIT_LOST} if the lock was lost while CMD ran (CMD was stopped), "
            f"{EXIT_NOT_FOUND}/{EXIT_CANNOT_EXECUTE} if CMD was not found / cannot be "
            "executed, 128+N if CMD was killed by signal N. SIGINT, SIGTERM, SIGHUP and "
            "SIGQUIT are forwarded to CMD. CMD gets DISTLOCK_NAME and DISTLOCK_FENCE in its "
            "environment.",
        )
        assert isinstance(run, _SubcommandParser)
        run.program_dest = "program"
        run.add_argument("name", metavar="NAME", help="the lock's name")
        run.add_argument(
            "--wait",
            type=seconds_type(allow_zero=True),
            default=0.0,
            metavar="SECONDS",
            help="wait up to SECONDS for a busy lock (default: 0, fail at once)",
        )
        run.add_argument(
            "--timeout",
            type=seconds_type(allow_zero=False),
            default=None,
            metavar="SECONDS",
            help="lease of the lock, renewed while CMD runs (default: DISTLOCK['TIMEOUT'])",
        )
        run.add_argument(
            "--grace",
            type=seconds_type(allow_zero=True),
            default=10.0,
            metavar="SECONDS",
            help="if the lock is lost, time between SIGTERM and SIGKILL to CMD (default: 10)",
        )
        run.add_argument("program", nargs="*", metavar="CMD", help="-- CMD ARGS...")

        prune = subcommands.add_parser(
            "prune-events", parents=common, help="delete old lock events"
        )
        prune.add_argument(
            "--older-than",
            type=_older_than,
            required=True,
            metavar="DURATION",
            help="30d, 12h, 90m, 45s or a number of seconds",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the chosen subcommand."""
        subcommand = options["subcommand"]
        handler = getattr(self, "handle_" + subcommand.replace("-", "_"))
        handler(**options)

    def handle_list(self, *, prefix: str, **options: Any) -> None:
        """``list [--prefix P]``: a table of held locks."""
        from django_distlock.models import HeldLock

        with _redis_errors():
            queryset = HeldLock.objects.all()
            if prefix:
                queryset = queryset.filter(name__startswith=prefix)
            locks = list(queryset.order_by("name"))
        policy = lock_server_eviction_policy()
        if policy is not None:
            self.stderr.write(
                f"Warning: the lock server evicts keys (maxmemory-policy {policy}): held "
                "locks can vanish. Use noeviction.",
                self.style.WARNING,
            )
        if not locks:
            self.stdout.write("No locks held.")
            return
        now = time.time()
        rows = [
            [
                escape_for_terminal(held.name),
                escape_for_terminal(held.owner),
                escape_for_terminal(held.context),
                str(held.fence),
                format_duration(now - held.acquired_at.timestamp()),
                format_duration(held.ttl),
                "yes" if held.auto_renew else "no",
            ]
            for held in locks
        ]
        headers = ["NAME", "HOLDER", "CONTEXT", "FENCE", "HELD FOR", "TTL", "AUTO-RENEW"]
        for line in render_table(headers, rows):
            self.stdout.write(line)
        self.stdout.write(f"{len(locks)} lock{'s' if len(locks) != 1 else ''} held.")

    def handle_show(self, *, name: str, **options: Any) -> None:
        """``show NAME``: every field of one held lock."""
        held = self._get(name)
        age = time.time() - held.acquired_at.timestamp()
        fields = [
            ("name", escape_for_terminal(held.name)),
            ("host", escape_for_terminal(held.host)),
            ("pid", str(held.pid)),
            ("thread", escape_for_terminal(held.thread)),
            ("context", escape_for_terminal(held.context)),
            ("fence", str(held.fence)),
            ("acquired at", f"{utc_timestamp(held.acquired_at)} ({format_duration(age)} ago)"),
            ("lease", format_duration(held.lease)),
            ("TTL remaining", format_duration(held.ttl)),
            ("auto-renew", "yes" if held.auto_renew else "no"),
        ]
        width = max(len(label) for label, _ in fields) + 1
        for label, value in fields:
            self.stdout.write(f"{label + ':':<{width}} {value}")

    def handle_release(self, *, name: str, force: bool, **options: Any) -> None:
        """``release NAME --force``: compare-and-delete on the token just read."""
        if not force:
            raise CommandError(
                f"refusing to release lock {name!r} without --force: its holder may still be "
                "working, and releasing it lets another process in at the same time"
            )
        held = self._get(name)
        holder = f"{escape_for_terminal(held.host)} pid {held.pid}"
        with _redis_errors():
            released = held.release(force=True)
        if not released:
            raise CommandError(
                f"lock {name!r} changed hands or was released before it could be "
                "force-released; nothing was done"
            )
        self.stdout.write(
            f"Released lock {name!r} (held by {holder} since "
            f"{utc_timestamp(held.acquired_at)}, fence {held.fence})."
        )

    def handle_run(
        self,
        *,
        name: str,
        program: list[str],
        wait: float,
        timeout: float | None,
        grace: float,
        **options: Any,
    ) -> None:
        """``run NAME -- CMD ARGS...``: exits with CMD's status (see the module doc)."""
        if not program:
            raise CommandError(
                "run needs a program: distlock run NAME [--wait S] [--timeout S] -- CMD ARGS..."
            )
        try:
            validate_name(name)
        except (TypeError, ValueError) as exc:
            raise CommandError(f"invalid lock name: {exc}") from None
        run = _ProgramRun(
            write_error=self.stderr.write,
            name=name,
            program=program,
            wait=wait,
            timeout=timeout,
            grace=grace,
        )
        sys.exit(run.run())

    def handle_prune_events(self, *, older_than: datetime.timedelta, **options: Any) -> None:
        """``prune-events --older-than DURATION``: delete old ``LockEvent`` rows."""
        from django_distlock.events import prune_events

        deleted = prune_events(older_than)
        self.stdout.write(
            f"Deleted {deleted} lock event{'s' if deleted != 1 else ''} older than "
            f"{format_duration(older_than.total_seconds())}."
        )

    def _get(self, name: str) -> Any:
        from django_distlock.models import HeldLock

        with _redis_errors():
            try:
                return HeldLock.objects.get(name=name)
            except HeldLock.DoesNotExist:
                raise CommandError(f"lock {name!r} is not held") from None
