"""What Celery's locked tasks (:mod:`.celery`) and those of Django's tasks framework
(:mod:`.tasks`) share: their options, checked where the task is defined
(:class:`RunOptions`), the lock a run takes (:func:`run_lock`), and how its log lines
name the holder of a busy lock (:func:`holder_of`)."""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from ..commands.terminal import escape_for_terminal, timestamp_and_age
from ..engine import (
    MAX_CONTEXT_LENGTH,
    Lock,
    LockError,
    NameTemplate,
    clean_label,
    current_holder,
    validate_name,
    validate_seconds,
)
from ..locks import distlock
from ..managers import owner_label

__all__ = ["RunOptions", "end_run", "holder_of", "lease_of", "run_label", "run_lock"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """A locked task's options, checked: the name template bound to the task function's
    signature, what a run does when the lock is busy, and the claims of
    ``unique_while_queued``."""

    template: str
    is_template: bool
    """Whether the name is filled from the arguments (metrics label it by template)."""
    name_for: Callable[[Sequence[Any], Mapping[str, Any]], str]
    on_busy: str
    wait: float | None
    """Seconds a run waits for a busy lock (``None``: as long as it takes)."""
    timeout: float | None
    unique_while_queued: bool
    unique_timeout: float

    @classmethod
    def build(
        cls,
        name: Any,
        func: Callable[..., Any],
        *,
        choices: tuple[str, ...],
        on_busy: Any,
        blocking_timeout: Any,
        timeout: Any,
        unique_while_queued: Any,
        unique_timeout: Any,
        argument: str = "",
        **more: Any,
    ) -> Self:
        """Check everything now (``TypeError``/``ValueError`` naming the option, after
        the ``argument`` prefix), so that a task that cannot work fails where it is
        defined. ``choices`` are the integration's ``on_busy`` values; ``more`` are the
        fields of a subclass, checked by the caller."""
        if on_busy not in choices:
            raise ValueError(
                f"{argument}on_busy must be one of {', '.join(map(repr, choices))}, not {on_busy!r}"
            )
        if not isinstance(unique_while_queued, bool):
            raise TypeError(
                f"{argument}unique_while_queued must be a bool, "
                f"not {type(unique_while_queued).__name__}"
            )
        template = NameTemplate(name)
        if template.is_constant:
            validate_name(name, f"{argument}name")
        if blocking_timeout is not None:
            wait = validate_seconds(
                blocking_timeout, f"{argument}blocking_timeout", allow_zero=True
            )
        else:
            wait = None if on_busy == "wait" else 0.0
        return cls(
            template=name,
            is_template=not template.is_constant,
            name_for=template.namer(inspect.signature(func), f"{func.__qualname__}()"),
            on_busy=on_busy,
            wait=wait,
            timeout=None if timeout is None else validate_seconds(timeout, f"{argument}timeout"),
            unique_while_queued=unique_while_queued,
            unique_timeout=validate_seconds(unique_timeout, f"{argument}unique_timeout"),
            **more,
        )


def run_label(prefix: str, task_name: str, run_id: str | None) -> str:
    """``billing.import_account[<run id>]``, short enough for a context label after
    ``prefix`` (the id is kept whole: a run recognises its own claim by it)."""
    suffix = "" if run_id is None else f"[{run_id}]"
    room = MAX_CONTEXT_LENGTH - len(prefix) - len(suffix)
    return clean_label(f"{task_name[: max(room, 0)]}{suffix}")


def run_lock(
    name: str, options: RunOptions, prefix: str, label: str, logger: logging.Logger
) -> Lock:
    """The lock a run of a task labelled ``label`` holds: renewed while it runs, its
    context ``prefix + label``, a loss logged on ``logger`` as it happens."""
    lock = distlock(
        name,
        timeout=options.timeout,
        auto_renew=True,
        on_lost=functools.partial(_report_lost, logger, label),
        context=f"{prefix}{label}",
    )
    if options.is_template:
        lock.template = options.template
    return lock


def lease_of(lock: Lock) -> float:
    """The lease of a run's lock, in seconds (its ``timeout``, else the backend's)."""
    return lock.timeout or lock.backend.timeout


def end_run(lock: Lock, exc: BaseException | None, finish: Callable[[], LockError | None]) -> None:
    """After a run's body ended with ``exc`` (``None``: it returned): ``finish`` (the
    run's claim bookkeeping, which returns the error it logged), then the lock given back
    as leaving ``with`` does. The body's own exception is never replaced."""
    try:
        finish_error = finish()
    finally:
        if exc is None:
            lock.__exit__(None, None, None)
        else:
            lock.__exit__(type(exc), exc, exc.__traceback__)
    if finish_error is not None and exc is None:
        raise finish_error


def holder_of(lock: Lock) -> str:
    """``web-3:4242 MainThread since 2026-11-22 10:01:02 UTC (12s ago)``: who holds
    ``lock``'s name, for a log line."""
    try:
        record = current_holder(lock.backend, lock.name)
    except LockError:
        record = None
    if record is None:
        return "someone else (who has just let go)"
    since = datetime.datetime.fromtimestamp(record.acquired_at, datetime.UTC)
    owner = owner_label(record.host, record.pid, record.thread)
    return f"{escape_for_terminal(owner)} since {timestamp_and_age(since)}"


def _report_lost(logger: logging.Logger, label: str, lock: Lock) -> None:
    # on_lost of a run's lock: a function, not a method of the run, so that the lock
    # does not keep the run alive (nor the run the lock) through a cycle.
    logger.warning(
        "%s lost its lock %r while it ran (%s): another run may start now",
        label,
        lock.name,
        lock.lost_reason or "its lease ended",
    )
