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
``127`` if the program was not found and ``126`` if it could not be executed (the
``EXIT_*`` constants of :mod:`django_distlock.supervisor`, which runs the program). The other
subcommands exit with ``0`` on success and ``1`` on any error (a ``CommandError``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_distlock.durations import duration_type, format_duration, seconds_type
from django_distlock.engine.exceptions import LockBackendUnavailable, LockNotAcquired
from django_distlock.engine.keys import clean_label, validate_name
from django_distlock.events import prune_events
from django_distlock.heldlocks import lock_server_eviction_policy
from django_distlock.lockedcommand import holder_description
from django_distlock.locks import distlock
from django_distlock.models import HeldLock
from django_distlock.supervisor import (
    EXIT_BUSY,
    EXIT_CANNOT_EXECUTE,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    LockedProgram,
)
from django_distlock.terminal import (
    escape_for_terminal,
    holder_label,
    render_table,
    timestamp_and_age,
    utc_timestamp,
)

__all__ = ["Command"]

_LIST_HEADERS = ["NAME", "HOLDER", "CONTEXT", "FENCE", "HELD FOR", "TTL", "AUTO-RENEW"]
_LIST_COLUMN_LIMITS = {"NAME": 48, "HOLDER": 40, "CONTEXT": 32}
_LIST_RIGHT_ALIGNED = frozenset({"FENCE", "HELD FOR", "TTL"})


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
            type=duration_type,
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
        table = render_table(
            _LIST_HEADERS,
            rows,
            column_limits=_LIST_COLUMN_LIMITS,
            right_aligned=_LIST_RIGHT_ALIGNED,
        )
        for line in table:
            self.stdout.write(line)
        self.stdout.write(f"{len(locks)} lock{'s' if len(locks) != 1 else ''} held.")

    def handle_show(self, *, name: str, **options: Any) -> None:
        """``show NAME``: every field of one held lock."""
        held = self._get(name)
        fields = [
            ("name", escape_for_terminal(held.name)),
            ("host", escape_for_terminal(held.host)),
            ("pid", str(held.pid)),
            ("thread", escape_for_terminal(held.thread)),
            ("context", escape_for_terminal(held.context)),
            ("fence", str(held.fence)),
            ("acquired at", timestamp_and_age(held.acquired_at)),
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
        holder = holder_label(held.host, held.pid)
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
        sys.exit(self._run_program(name, program, wait=wait, timeout=timeout, grace=grace))

    def _run_program(
        self, name: str, program: list[str], *, wait: float, timeout: float | None, grace: float
    ) -> int:
        """The exit status of ``run``: the program's, or why it did not run."""

        def report(message: str) -> None:
            self.stderr.write(f"distlock run: {message}")

        lock = distlock(
            name,
            timeout=timeout,
            blocking=wait > 0,
            blocking_timeout=wait,
            auto_renew=True,
            context=clean_label(f"distlock run {os.path.basename(program[0])}"),
        )
        started = time.monotonic()
        try:
            return LockedProgram(lock, program, grace=grace, report=report).run()
        except LockBackendUnavailable as exc:
            report(f"cannot take lock {name!r}, Redis is unavailable: {exc}")
            return EXIT_UNAVAILABLE
        except ImproperlyConfigured as exc:
            report(f"cannot take lock {name!r}: {exc}")
            return EXIT_UNAVAILABLE
        except LockNotAcquired:
            # The program never started, so all the time since was spent waiting.
            waited = (
                f" after waiting {format_duration(time.monotonic() - started)}" if wait > 0 else ""
            )
            holder = holder_description(name)
            who = f"held by {holder}" if holder else "held by another process"
            report(
                f"lock {name!r} is {who}{waited}; not running {program[0]!r}"
                + ("" if wait > 0 else " (use --wait to wait)")
            )
            return EXIT_BUSY

    def handle_prune_events(self, *, older_than: datetime.timedelta, **options: Any) -> None:
        """``prune-events --older-than DURATION``: delete old ``LockEvent`` rows."""
        deleted = prune_events(older_than)
        self.stdout.write(
            f"Deleted {deleted} lock event{'s' if deleted != 1 else ''} older than "
            f"{format_duration(older_than.total_seconds())}."
        )

    def _get(self, name: str) -> HeldLock:
        with _redis_errors():
            try:
                return HeldLock.objects.get(name=name)
            except HeldLock.DoesNotExist:
                raise CommandError(f"lock {name!r} is not held") from None
