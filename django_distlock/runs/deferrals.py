"""Deferral by need (both task integrations): a busy run that is put off (the tasks'
``on_busy="defer"``, Celery's ``"retry"``) runs again soon after the holder lets go,
instead of at the end of the holder's lease.

The put-off copy is queued as before, to run after the holder's remaining lease: that is
the upper bound, kept whatever becomes of this process. Its id is parked beside the lock
(:meth:`~.claims.TaskClaims.park`). One thread per process and lock name
waits for the lock meanwhile (a blocking wait woken by the release, not polling, bounded
by the parked copies' times); as soon as it gets the lock it gives it back and queues an
early copy of each parked one still waiting, marking it served (compare-and-set). A
parked copy whose time comes after it was served ends without running; one that runs
first takes its record, so no early copy is queued for it. Each put-off run's work runs
once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from ..engine import LockError
from ..locks import distlock
from .claims import TaskClaims

__all__ = ["Parked", "serve_when_free"]

logger = logging.getLogger("django_distlock.deferrals")

PARKED_FOR = 86400.0
"""Seconds a parked copy's record lasts at least after its time: long enough for a
backlogged queue to reach it."""


@dataclass(eq=False)
class Parked:
    """A put-off copy (its id ``claims.task_id``) due at ``due`` (``time.monotonic()``),
    and how to queue an early copy in its place (``queue_early``; raises on failure)."""

    claims: TaskClaims
    due: float
    queue_early: Callable[[], object]
    label: str


def serve_when_free(parked: Parked, lease: float, context: str) -> None:
    """Park ``parked`` (its record beside the lock) and have this process's watcher of
    the lock queue its early copy once the lock is released before ``parked.due``.
    ``lease`` bounds the watcher's own hold (it gives the lock back at once); ``context``
    is its context label."""
    delay = max(parked.due - time.monotonic(), 0.0)
    parked.claims.park(delay + PARKED_FOR)
    with _watchers_lock:  # not between a watcher's last look and its leaving
        _watcher(parked.claims.name, lease, context).add(parked)


class _Watcher:
    """The thread waiting for one lock name's release on behalf of its parked copies."""

    def __init__(self, name: str, lease: float, context: str) -> None:
        self.name = name
        self.lease = lease
        self.context = context
        self.parked: list[Parked] = []
        self.thread: threading.Thread | None = None

    def add(self, parked: Parked) -> None:
        with _watchers_lock:
            self.parked.append(parked)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name=f"distlock-deferrals {self.name}", daemon=True
                )
                self.thread.start()

    def _take(self, *, freed: bool) -> list[Parked] | None:
        """The parked copies to serve now (all when the lock was ``freed``), dropping
        those past their time (they run by themselves); ``None`` when none is left (the
        watcher is then gone)."""
        now = time.monotonic()
        with _watchers_lock:
            served = self.parked if freed else []
            self.parked = [] if freed else [each for each in self.parked if each.due > now]
            if not self.parked and not served:
                self.thread = None
                _watchers.pop(self.name, None)
                return None
            return served

    def _run(self) -> None:
        lock = distlock(self.name, timeout=self.lease, auto_renew=False, context=self.context)
        freed = False
        try:
            while (served := self._take(freed=freed)) is not None:
                for parked in served:
                    _serve(parked)
                freed = False
                with _watchers_lock:
                    if not self.parked:
                        continue
                    wait = min(each.due for each in self.parked) - time.monotonic()
                try:
                    freed = lock.acquire(blocking_timeout=max(wait, 0.0))
                    if freed:
                        lock.release()
                except LockError as error:
                    logger.warning(
                        "waiting for lock %r to be released for its put-off runs: %s",
                        self.name,
                        error,
                    )
                    time.sleep(min(max(wait, 0.0), 1.0))
        finally:
            connections.close_all()  # this thread's own


def _serve(parked: Parked) -> None:
    """Queue ``parked``'s early copy, unless the copy ran already (or was served)."""
    try:
        if not parked.claims.serve_early():
            return
    except LockError as error:
        logger.warning("%s: could not queue it early: %s", parked.label, error)
        return
    try:
        parked.queue_early()
    except Exception:
        logger.exception("%s: could not queue it early; it runs at its time", parked.label)
        try:
            parked.claims.unserve()
        except LockError as error:
            logger.error("%s: its early copy is lost: %s", parked.label, error)
        return
    logger.info(
        "%s: lock %r was released; its put-off run was queued again to run now",
        parked.label,
        parked.claims.name,
    )


_watchers: dict[str, _Watcher] = {}
_watchers_pid = os.getpid()
_watchers_lock = threading.RLock()


def _watcher(name: str, lease: float, context: str) -> _Watcher:
    global _watchers_pid
    with _watchers_lock:
        if _watchers_pid != os.getpid():  # a forked child: the parent's threads are not here
            _watchers.clear()
            _watchers_pid = os.getpid()
        watcher = _watchers.get(name)
        if watcher is None:
            watcher = _watchers[name] = _Watcher(name, lease, context)
        return watcher
