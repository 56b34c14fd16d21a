"""The claims of runs waiting for their lock (``unique_while_queued``, both task
integrations), kept alive by the worker that waits.

A run that is about to wait for its lock marks its claim waiting for one lease of the
lock (:meth:`~.claims.TaskClaims.wait`), and one daemon thread per process
renews it at a third of that lease until the wait ends. A worker killed while its run
waits renews nothing more: the claim ends at that lease's end, and the name is free
again, instead of staying claimed "queued" for ``unique_timeout``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..engine import LockError
from .claims import TaskClaims

__all__ = ["Waiting", "start_waiting", "stop_waiting", "waiting"]

logger = logging.getLogger("django_distlock.claims")

RENEWALS_PER_LEASE = 3


@dataclass(eq=False)
class Waiting:
    """A claim kept waiting: ``claims`` for ``lease`` seconds, renewed when ``due``."""

    claims: TaskClaims
    lease: float
    due: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.due = time.monotonic() + self.lease / RENEWALS_PER_LEASE


def start_waiting(claims: TaskClaims, lease: float) -> Waiting | None:
    """Mark ``claims`` waiting for ``lease`` seconds and keep it so until
    :func:`stop_waiting`; ``None`` (nothing kept) when another task holds the claim."""
    if not claims.wait(lease):
        return None
    kept = Waiting(claims, lease)
    _keeper().keep(kept)
    return kept


def stop_waiting(kept: Waiting | None) -> None:
    """Stop renewing a claim kept by :func:`start_waiting` (no I/O: the claim then turns
    running, or is given back, by the run)."""
    if kept is not None:
        _keeper().drop(kept)


@contextlib.contextmanager
def waiting(claims: TaskClaims, lease: float) -> Iterator[None]:
    """``claims`` kept waiting, for ``lease`` seconds at a time, while the block runs."""
    kept = start_waiting(claims, lease)
    try:
        yield
    finally:
        stop_waiting(kept)


class _Keeper:
    """The thread renewing waiting claims, started on first use."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.condition = threading.Condition()
        self.kept: dict[int, Waiting] = {}
        self.thread: threading.Thread | None = None

    def keep(self, kept: Waiting) -> None:
        with self.condition:
            self.kept[id(kept)] = kept
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="distlock-waiting-claims", daemon=True
                )
                self.thread.start()
            self.condition.notify()

    def drop(self, kept: Waiting) -> None:
        with self.condition:
            self.kept.pop(id(kept), None)

    def _next(self) -> Waiting:
        """The next claim due, once it is due (waiting meanwhile)."""
        with self.condition:
            while True:
                if not self.kept:
                    self.condition.wait()
                    continue
                kept = min(self.kept.values(), key=lambda each: each.due)
                delay = kept.due - time.monotonic()
                if delay <= 0:
                    kept.due = time.monotonic() + kept.lease / RENEWALS_PER_LEASE
                    return kept
                self.condition.wait(delay)

    def _run(self) -> None:
        while True:
            kept = self._next()
            try:
                still = kept.claims.still_waiting(kept.lease)
            except LockError as error:
                # Tried again at the next third: the claim lapses only if a whole lease
                # goes by without a renewal, as a killed worker's does.
                logger.warning(
                    "could not renew the waiting claim of %s on lock name %r: %s",
                    kept.claims.task_id,
                    kept.claims.name,
                    error,
                )
                continue
            if not still:
                self.drop(kept)


_keepers: dict[int, _Keeper] = {}
_keepers_lock = threading.Lock()


def _keeper() -> _Keeper:
    # One per process: a forked child (a Celery prefork pool process) starts its own
    # thread, the parent's is not there.
    pid = os.getpid()
    keeper = _keepers.get(pid)
    if keeper is None:
        with _keepers_lock:
            keeper = _keepers.get(pid)
            if keeper is None:
                _keepers.clear()
                keeper = _keepers[pid] = _Keeper()
    return keeper
