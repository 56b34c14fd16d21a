"""Management commands that run under a lock: ``LockedCommand`` and ``LockedCommandMixin``.

A cron job or deploy hook that must never overlap with itself, on any host, becomes::

    from django_distlock import LockedCommand

    class Command(LockedCommand):           # the lock is named after the command
        def handle(self, *args, **options):
            sync_catalog(fence=self.lock.fence)

Every such command gains ``--lock-wait SECONDS``, ``--lock-timeout SECONDS`` and
``--no-lock``, from the command line and through ``call_command``. A busy lock fails with a
``CommandError`` naming the holder; a lock lost while the command ran fails it too, even
if ``handle()`` returned normally.

The messages name a lock's holders as ``manage.py distlock run`` does
(:func:`~django_distlock.commands.holders.holder_description`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..engine import (
    LockBackendUnavailable,
    LockError,
    LockLost,
    NameTemplate,
    TemplateError,
    clean_label,
    validate_name,
)
from ..locks import check_kind, distlock
from .durations import format_duration, seconds_type
from .holders import holder_description

if TYPE_CHECKING:
    from ..engine import Lock

    _CommandBase = BaseCommand
else:
    _CommandBase = object

__all__ = [
    "LockedCommand",
    "LockedCommandMixin",
    "add_wait_and_lease",
    "busy_message",
    "command_lock",
]


def busy_message(name: str, waited: float) -> str:
    """The message of a command that did not get lock ``name`` (after ``waited`` s)."""
    holder = holder_description(name)
    shown = repr(name)  # repr escapes control characters too
    if waited > 0:
        who = f" by {holder}" if holder else ""
        return (
            f"lock {shown} is still held{who} after waiting {format_duration(waited)}; "
            "use a longer --lock-wait to wait longer"
        )
    if holder:
        return f"lock {shown} is held by {holder}; use --lock-wait to wait"
    return (
        f"lock {shown} is busy (its holder could not be read: it may have released it just "
        "now); try again, or use --lock-wait to wait"
    )


def add_wait_and_lease(
    parser: Any,
    *,
    wait: str,
    lease: str,
    default_wait: float | None,
    shown_wait: float,
    runs: str,
) -> None:
    """Add to ``parser`` (or an argument group) the option ``wait`` (seconds to wait for a
    busy lock) and the option ``lease`` (the lock's lease, renewed while ``runs`` runs),
    both durations (``90``, ``1.5``, ``5m``); ``shown_wait`` is the wait ``--help`` gives as
    the default. Shared by locked commands and ``distlock run``."""
    waiting = f"wait up to SECONDS for a busy lock (default: {shown_wait:g}, fail at once)"
    leasing = f"lease of the lock, renewed while {runs} runs (default: DISTLOCK['TIMEOUT'])"
    options = ((wait, True, default_wait, waiting), (lease, False, None, leasing))
    for flag, allow_zero, default, text in options:
        parser.add_argument(
            flag,
            type=seconds_type(allow_zero=allow_zero),
            default=default,
            metavar="SECONDS",
            help=text,
        )


def command_lock(
    name: str,
    *,
    wait: float,
    timeout: float | None,
    context: str,
    limit: int | None = None,
    shared: bool = False,
    on_lost: Callable[[Lock], None] | None = None,
) -> Lock:
    """The lock a command holds while it runs: renewed for as long as it runs, waited for
    up to ``wait`` seconds (``0``: not at all), labelled ``context``. ``TypeError`` or
    ``ValueError`` for an invalid name or option. Shared by locked commands and
    ``distlock run``."""
    validate_name(name, "lock name")
    return distlock(
        name,
        timeout=timeout,
        blocking=wait > 0,
        blocking_timeout=wait,
        auto_renew=True,
        on_lost=on_lost,
        context=clean_label(context),
        limit=limit,
        shared=shared,
    )


class LockedCommandMixin(_CommandBase):
    """Runs a management command under a distributed lock; put it before ``BaseCommand``
    (or your existing command base class)::

        class Command(LockedCommandMixin, BaseCommand):
            lock_name = "import:{source}"    # filled from the parsed options
            lock_timeout = 120               # lease (renewed while the command runs)

            def add_arguments(self, parser):
                parser.add_argument("source")

            def handle(self, *args, **options): ...

    The lock is taken in :meth:`execute`, so it applies on the command line and through
    ``call_command`` alike, and around the system checks and ``handle()``. While the
    command runs, ``self.lock`` is the held :class:`~django_distlock.engine.Lock` (use
    ``self.lock.fence`` for fenced writes, ``self.lock.lost`` to stop early). The lock
    is renewed for as long as the command runs; ``lock_timeout`` (default
    ``DISTLOCK["TIMEOUT"]``) only bounds how long a crashed run blocks the next one.

    Failures, all ``CommandError`` (exit status 1 on the command line): the lock is busy
    (the message names the holder's host, pid and since when), Redis cannot be reached,
    or the lock was lost while the command ran.
    """

    lock_name: str | None = None
    """The lock's name; default: the command's name. A ``str.format`` template is filled
    from the parsed options (``"import:{source}"``). Override :meth:`get_lock_name` for
    anything else."""
    lock_timeout: float | None = None
    """Lease in seconds (default ``DISTLOCK["TIMEOUT"]``); ``--lock-timeout`` overrides."""
    lock_wait: float = 0
    """Seconds to wait for a busy lock (``0``: fail at once); ``--lock-wait`` overrides."""
    lock_limit: int | None = None
    """Let up to this many runs hold the lock at once (``distlock(..., limit=N)``); the
    next one is busy. ``None`` (default): one run at a time."""
    lock_shared: bool = False
    """Take a shared hold (``distlock(..., shared=True)``): runs of commands with a shared
    hold of the same name run together, and one with an exclusive hold waits for them."""

    lock: Lock | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        try:
            check_kind(limit=cls.lock_limit, shared=cls.lock_shared)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{cls.__module__}.{cls.__qualname__}: {exc}") from None

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Add the locking options after the command's own (``add_arguments`` need not
        call ``super()``)."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        group = parser.add_argument_group("distributed lock")
        add_wait_and_lease(
            group,
            wait="--lock-wait",
            lease="--lock-timeout",
            default_wait=None,
            shown_wait=self.lock_wait,
            runs="the command",
        )
        group.add_argument(
            "--no-lock", action="store_true", help="run without taking the lock (careful)"
        )
        return parser

    @property
    def command_name(self) -> str:
        """The command's name: the module it is defined in (``sync_catalog``)."""
        return type(self).__module__.rpartition(".")[2]

    def get_lock_name(self, **options: Any) -> str:
        """The lock's name for this run: :attr:`lock_name` filled from ``options``, or the
        command's name."""
        if self.lock_name is None:
            return self.command_name
        try:
            return NameTemplate(self.lock_name).fill(options)
        except TemplateError as exc:
            raise CommandError(
                f"lock_name {self.lock_name!r} of {self.command_name} cannot be filled "
                f"from the command's options ({exc}); options are {sorted(options)}"
            ) from None
        except ValueError as exc:  # the filled name is not a valid lock name
            raise CommandError(f"invalid lock for {self.command_name}: {exc}") from None

    def on_lock_lost(self) -> None:
        """Called from the lease-renewal thread when the lock is found lost (another
        process may now hold it). The default writes a warning to stderr; the command
        still fails with ``CommandError`` when it ends."""
        self.stderr.write(
            f"Warning: lock {self.lock.name!r} was lost; another "
            "process may be running the same work now"
            if self.lock is not None
            else "Warning: the command's lock was lost"
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        """Take the lock, run the command (checks and ``handle()``), release the lock."""
        if options.get("no_lock"):
            return super().execute(*args, **options)
        wait = options.get("lock_wait")
        wait = float(self.lock_wait) if wait is None else wait
        timeout = options.get("lock_timeout")
        timeout = self.lock_timeout if timeout is None else timeout
        name = self.get_lock_name(**options)
        lock = self._build_lock(name, wait=wait, timeout=timeout)
        started = time.monotonic()
        try:
            acquired = lock.acquire()
        except LockBackendUnavailable as exc:
            raise CommandError(f"cannot take lock {name!r}: {exc}") from exc
        except ImproperlyConfigured as exc:
            raise CommandError(f"cannot take lock {name!r}: {exc}") from exc
        if not acquired:
            waited = time.monotonic() - started if wait > 0 else 0.0
            raise CommandError(busy_message(name, waited))
        self.lock = lock
        try:
            result = super().execute(*args, **options)
        except BaseException as exc:
            # Leave the lock the way ``with`` does: the command's own error wins, and a
            # lock that cannot be released stops being renewed.
            lock.__exit__(type(exc), exc, exc.__traceback__)
            raise
        try:
            lock.__exit__(None, None, None)
        except LockLost as exc:
            raise CommandError(
                f"lock {name!r} was lost while the command ran, so another process may "
                f"have run at the same time: {exc}"
            ) from exc
        except LockError as exc:
            raise CommandError(f"could not release lock {name!r}: {exc}") from exc
        return result

    def _build_lock(self, name: str, *, wait: float, timeout: float | None) -> Lock:
        try:
            return command_lock(
                name,
                wait=wait,
                timeout=timeout,
                context=f"manage.py {self.command_name}",
                limit=self.lock_limit,
                shared=self.lock_shared,
                on_lost=lambda lock: self.on_lock_lost(),
            )
        except (TypeError, ValueError) as exc:
            raise CommandError(f"invalid lock for {self.command_name}: {exc}") from exc


class LockedCommand(LockedCommandMixin, BaseCommand):
    """A ``BaseCommand`` that runs under a distributed lock named after the command.

    ::

        class Command(LockedCommand):
            lock_timeout = 300

            def handle(self, *args, **options):
                rebuild_search_index()

    ``manage.py rebuild_index`` then fails at once (non-zero exit) while another run
    holds the lock, naming it: ``lock 'rebuild_index' is held by web-3 pid 4242 since
    2026-11-22 10:01:02 UTC (12s ago); use --lock-wait to wait``. See
    :class:`LockedCommandMixin` for the attributes and options.
    """
