"""The one shape of the package's background jobs (telling holders of lost locks,
recording metrics, writing lock events): a daemon thread of this process fed through an
in-memory buffer, off the lock's path."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BackgroundWorker"]

logger = logging.getLogger("django_distlock")

T = TypeVar("T")


class BackgroundWorker(Generic[T]):
    """A daemon thread named ``name`` that hands what is put in its buffer to
    ``drain(buffer)`` (which takes the items it handles out of the ``deque``):

    - :meth:`put` never blocks nor raises: with ``capacity`` items buffered, an item is
      dropped and ``on_drop()`` called (to count it, to report it);
    - the thread starts with the first item and drains every ``interval`` seconds, as
      soon as ``batch`` items are buffered, and when flushed; an exception of ``drain``
      is logged, and the thread goes on;
    - :meth:`flush` waits until what was buffered before it is drained; :meth:`close`
      drains one last time, calls ``on_stop()`` and ends the thread.
    """

    def __init__(
        self,
        name: str,
        drain: Callable[[deque[T]], None],
        *,
        capacity: int | None = None,
        interval: float = 1.0,
        batch: int | None = None,
        on_drop: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.buffer: deque[T] = deque()
        self.capacity = capacity
        self.interval = interval
        self.batch = batch
        self.closing = False
        self._drain = drain
        self._on_drop = on_drop
        self._on_stop = on_stop
        self._wake = threading.Event()
        self._served = threading.Condition()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._requested = 0
        self._done = 0

    def put(self, item: T) -> bool:
        """Buffer ``item``; ``False`` when the buffer is full and it was dropped."""
        buffer = self.buffer
        if self.capacity is not None and len(buffer) >= self.capacity:
            if self._on_drop is not None:
                self._on_drop()
            return False
        buffer.append(item)
        if self._thread is None:
            self._start()
        if self.batch is not None and len(buffer) >= self.batch and not self._wake.is_set():
            self._wake.set()
        return True

    @property
    def started(self) -> bool:
        """Whether the thread was started (with the first item)."""
        return self._thread is not None

    def flush(self, timeout: float) -> bool:
        """Have the thread drain what is buffered now; wait up to ``timeout`` seconds.
        Returns whether it was drained."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return not self.buffer
        with self._served:
            self._requested += 1
            ticket = self._requested
            self._wake.set()
            return self._served.wait_for(
                lambda: self._done >= ticket or not thread.is_alive(), timeout
            )

    def close(self, timeout: float) -> bool:
        """Drain one last time and end the thread, waiting at most ``timeout`` seconds;
        ``False`` if it is still busy then (nothing is waited for any longer)."""
        thread = self._thread
        if thread is None or self.closing:
            return True
        with self._served:
            self.closing = True
            self._wake.set()
        thread.join(timeout)
        return not thread.is_alive()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            self._thread = thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutdown: nothing runs any more
            self.closing = True

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            with self._served:
                self._wake.clear()
                target = self._requested
                closing = self.closing
            try:
                self._drain(self.buffer)
            except Exception:  # the thread must outlive anything
                logger.exception("django-distlock: the %s thread failed", self.name)
            with self._served:
                self._done = target
                self._served.notify_all()
            if closing:
                if self._on_stop is not None:
                    self._on_stop()
                return
