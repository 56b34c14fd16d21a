"""``manage.py distlock``: see and break held locks, run programs under a lock, prune events.

::

    manage.py distlock list [--prefix P]
    manage.py distlock show NAME
    manage.py distlock release NAME --force [--fence FENCE]
    manage.py distlock run NAME [--wait S] [--timeout S] [--grace S] [--limit N | --shared]
        -- CMD ARGS...
    manage.py distlock prune-events --older-than DURATION

A shared or limited lock has one hold per holder: ``list`` and ``show`` print each
(with its mode), and ``release`` breaks one of them (``--fence`` says which, when there
are several: fences are unique per name, and unlike tokens they are no capability).

Exit status of ``run`` (a cluster-wide ``flock(1)`` for cron): the program's own exit
status; ``128 + N`` if it was killed by signal N; ``75`` (``EX_TEMPFAIL``) if the lock
stayed busy; ``69`` (``EX_UNAVAILABLE``) if Redis could not be reached; ``70``
(``EX_SOFTWARE``) if the lock was lost while the program ran (the program was stopped);
``127`` if the program was not found and ``126`` if it could not be executed (the
``EXIT_*`` constants of :mod:`django_distlock.commands.supervisor`, which runs the
program). The other subcommands exit with ``0`` on success and ``1`` on any error (a
``CommandError``).

Why this module is long: it is one command, whose five subcommands share one parser
(Django's options after the subcommand, ``run``'s own ``--`` split) and one way of
reporting Redis errors; each subcommand is an argparse setup and a short handler, and
the work itself lives elsewhere (``HeldLock.objects``, ``supervisor``, ``events``).
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

from django_distlock.commands.durations import duration_type, format_duration, seconds_type
from django_distlock.commands.locked import holder_description
from django_distlock.commands.supervisor import (
    EXIT_BUSY,
    EXIT_CANNOT_EXECUTE,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    LockedProgram,
)
from django_distlock.commands.terminal import (
    escape_for_terminal,
    holder_label,
    render_table,
    timestamp_and_age,
    utc_timestamp,
)
from django_distlock.engine import (
    Lock,
    LockBackendUnavailable,
    LockNotAcquired,
    clean_label,
    validate_name,
)
from django_distlock.events import prune_events
from django_distlock.heldlocks import lock_server_eviction_policy
from django_distlock.locks import distlock
from django_distlock.models import HeldLock, Mode

__all__ = ["Command"]

_LIST_HEADERS = ["NAME", "MODE", "HOLDER", "CONTEXT", "FENCE", "HELD FOR", "TTL", "AUTO-RENEW"]
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
            help="held locks as a table, ordered by name (a row per hold)",
            description="Held locks: one row per hold (a shared or limited lock has one per "
            "holder), with its mode.",
        )
        listing.add_argument("--prefix", default="", help="only locks whose name starts so")

        show = subcommands.add_parser(
            "show", parents=common, help="everything known about one held lock (each hold)"
        )
        show.add_argument("name", metavar="NAME", help="the lock's name")

        release = subcommands.add_parser(
            "release",
            parents=common,
            help="force-release a held lock",
            description="Force-release a lock held by someone else. Its holder keeps running "
            "until its lease renewal notices (it is told the lock was lost). A shared or "
            "limited lock with several holds needs --fence (see show) to say which hold.",
        )
        release.add_argument("name", metavar="NAME", help="the lock's name")
        release.add_argument("--force", action="store_true", help="really release it (required)")
        release.add_argument(
            "--fence",
            type=int,
            default=None,
            help="the hold to release, by its fence (as list and show print it)",
        )

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
            "SIGQUIT are forwarded to CMD's process group, and the lock is released once no "
            "process of that group is left. CMD gets DISTLOCK_NAME and DISTLOCK_FENCE in its "
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
            help="if the lock is lost, time between SIGTERM and SIGKILL to CMD's process group "
            "(default: 10)",
        )
        kind = run.add_mutually_exclusive_group()
        kind.add_argument(
            "--limit",
            type=int,
            default=None,
            metavar="N",
            help="let up to N runs hold the lock at once (a limited lock)",
        )
        kind.add_argument(
            "--shared", action="store_true", help="take a shared hold (exclusive holds wait)"
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
                held.mode_label,
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
        names = len({held.name for held in locks})
        summary = f"{names} lock{'s' if names != 1 else ''} held"
        if len(locks) != names:
            summary += f" ({len(locks)} holds)"
        self.stdout.write(f"{summary}.")

    def handle_show(self, *, name: str, **options: Any) -> None:
        """``show NAME``: every field of each hold of one held lock."""
        holds = self._holds(name)
        for number, held in enumerate(holds, 1):
            if len(holds) > 1:
                self.stdout.write(("" if number == 1 else "\n") + f"hold {number} of {len(holds)}")
            self._show_hold(held)

    def _show_hold(self, held: HeldLock) -> None:
        fields = [
            ("name", escape_for_terminal(held.name)),
            ("mode", held.mode_label),
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

    def handle_release(
        self, *, name: str, force: bool, fence: int | None = None, **options: Any
    ) -> None:
        """``release NAME --force [--fence F]``: compare-and-delete on the token just read
        (of the hold with fence ``F``)."""
        if not force:
            raise CommandError(
                f"refusing to release lock {name!r} without --force: its holder may still be "
                "working, and releasing it lets another process in at the same time"
            )
        holds = self._holds(name)
        if fence is not None:
            chosen = [held for held in holds if held.fence == fence]
            if not chosen:
                raise CommandError(f"lock {name!r} has no hold with fence {fence}")
            holds = chosen
        if len(holds) > 1:
            fences = ", ".join(
                f"{held.fence} ({holder_label(held.host, held.pid)})" for held in holds
            )
            raise CommandError(
                f"lock {name!r} has {len(holds)} holds ({holds[0].mode_label}); pass --fence "
                f"to say which one to release: {fences}"
            )
        held = holds[0]
        holder = holder_label(held.host, held.pid)
        with _redis_errors():
            released = held.release(force=True)
        if not released:
            raise CommandError(
                f"lock {name!r} changed hands or was released before it could be "
                "force-released; nothing was done"
            )
        what = "lock" if held.mode == Mode.EXCLUSIVE else f"a {held.mode} hold of lock"
        self.stdout.write(
            f"Released {what} {name!r} (held by {holder} since "
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
        limit: int | None = None,
        shared: bool = False,
        **options: Any,
    ) -> None:
        """``run NAME -- CMD ARGS...``: exits with CMD's status (see the module doc)."""
        if not program:
            raise CommandError(
                "run needs a program: distlock run NAME [--wait S] [--timeout S] -- CMD ARGS..."
            )
        try:
            validate_name(name)
            lock = distlock(
                name,
                timeout=timeout,
                blocking=wait > 0,
                blocking_timeout=wait,
                auto_renew=True,
                context=clean_label(f"distlock run {os.path.basename(program[0])}"),
                limit=limit,
                shared=shared,
            )
        except (TypeError, ValueError) as exc:
            raise CommandError(f"invalid lock: {exc}") from None
        sys.exit(self._run_program(lock, program, wait=wait, grace=grace))

    def _run_program(self, lock: Lock, program: list[str], *, wait: float, grace: float) -> int:
        """The exit status of ``run``: the program's, or why it did not run."""

        def report(message: str) -> None:
            self.stderr.write(f"distlock run: {message}")

        name = lock.name
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

    def _holds(self, name: str) -> list[HeldLock]:
        """The holds of lock ``name`` (one unless it is shared or limited)."""
        with _redis_errors():
            holds = list(HeldLock.objects.filter(name=name))
        if not holds:
            raise CommandError(f"lock {name!r} is not held")
        return holds
