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

This module is the command's parser (Django's options after the subcommand, ``run``'s
own ``--`` split) and a short handler per subcommand; the work lives in
:mod:`django_distlock.commands` (``listing``, ``release``, ``run``) and
:func:`django_distlock.events.prune_events`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_distlock.commands.durations import duration_type, format_duration, seconds_type
from django_distlock.commands.holders import holds_of
from django_distlock.commands.listing import eviction_warning, held_locks, hold_lines, listing_lines
from django_distlock.commands.locked import add_wait_and_lease
from django_distlock.commands.release import force_release
from django_distlock.commands.run import program_lock, run_program
from django_distlock.commands.supervisor import (
    EXIT_BUSY,
    EXIT_CANNOT_EXECUTE,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
)
from django_distlock.engine import validate_name
from django_distlock.events import prune_events

__all__ = ["Command"]


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


def _lock_name(text: str) -> str:
    """An argparse ``type`` for ``NAME``: a usable lock name (not empty, no NUL, at most
    512 characters), refused before anything is asked of Redis."""
    try:
        return validate_name(text, "lock name")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _django_options() -> argparse.ArgumentParser:
    """Django's own options, accepted after the subcommand too (``distlock list
    --settings=...``), and left alone when not given there."""
    options = argparse.ArgumentParser(add_help=False)
    hidden: dict[str, Any] = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    options.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], **hidden)
    options.add_argument("--settings", **hidden)
    options.add_argument("--pythonpath", **hidden)
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        options.add_argument(flag, action="store_true", **hidden)
    return options


class Command(BaseCommand):
    """``manage.py distlock <subcommand>``: operate on the locks of the ``DISTLOCK``
    settings. Only locks under the configured key prefix are ever read or released."""

    help = "Inspect, break and use django-distlock locks: list, show, release, run, prune-events."
    # Operators need it most when something is wrong, so it does not stop at failed checks.
    requires_system_checks: ClassVar[list[str]] = []

    def add_arguments(self, parser: CommandParser) -> None:
        # Django adds --skip-checks only to commands that run checks; this one runs none,
        # so it accepts the option (before or after the subcommand) and ignores it.
        parser.add_argument("--skip-checks", action="store_true", help=argparse.SUPPRESS)
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
        show.add_argument("name", metavar="NAME", type=_lock_name, help="the lock's name")

        release = subcommands.add_parser(
            "release",
            parents=common,
            help="force-release a held lock",
            description="Force-release a lock held by someone else. Its holder keeps running "
            "until its lease renewal notices (it is told the lock was lost). A shared or "
            "limited lock with several holds needs --fence (see show) to say which hold.",
        )
        release.add_argument("name", metavar="NAME", type=_lock_name, help="the lock's name")
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
        run.add_argument("name", metavar="NAME", type=_lock_name, help="the lock's name")
        add_wait_and_lease(
            run, wait="--wait", lease="--timeout", default_wait=0.0, shown_wait=0, runs="CMD"
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
        locks = held_locks(prefix)
        warning = eviction_warning()
        if warning is not None:
            self.stderr.write(warning, self.style.WARNING)
        for line in listing_lines(locks):
            self.stdout.write(line)

    def handle_show(self, *, name: str, **options: Any) -> None:
        """``show NAME``: every field of each hold of one held lock."""
        holds = holds_of(name)
        for number, held in enumerate(holds, 1):
            if len(holds) > 1:
                self.stdout.write(("" if number == 1 else "\n") + f"hold {number} of {len(holds)}")
            for line in hold_lines(held):
                self.stdout.write(line)

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
        self.stdout.write(force_release(name, fence=fence))

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
        lock = program_lock(name, program, wait=wait, timeout=timeout, limit=limit, shared=shared)

        def report(message: str) -> None:
            self.stderr.write(f"distlock run: {message}")

        sys.exit(run_program(lock, program, wait=wait, grace=grace, report=report))

    def handle_prune_events(self, *, older_than: datetime.timedelta, **options: Any) -> None:
        """``prune-events --older-than DURATION``: delete old ``LockEvent`` rows."""
        deleted = prune_events(older_than)
        self.stdout.write(
            f"Deleted {deleted} lock event{'s' if deleted != 1 else ''} older than "
            f"{format_duration(older_than.total_seconds())}."
        )
