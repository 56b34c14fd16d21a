"""Per-event-loop state: the value kept for the last loop seen, and closing a loop's
connections when it shuts down. Asyncio connections belong to one loop; async code finds
its loop's pool, watchdog and closer at every request."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["LastLoop", "close_at_loop_shutdown"]

T = TypeVar("T")


def _gone() -> None:
    return None


class LastLoop(Generic[T]):
    """The value kept for the last event loop seen, found without a lookup in a registry
    weakly keyed by loops (which makes a weak reference per call). The loop is weakly
    referenced; loop and value are swapped together, so threads running loops of their
    own never see one loop's value under another loop."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[Callable[[], Any], T | None] = (_gone, None)

    def get(self, loop: asyncio.AbstractEventLoop) -> T | None:
        """The value remembered for ``loop``, else ``None``."""
        last_loop, value = self._last
        return value if value is not None and last_loop() is loop else None

    def remember(self, loop: asyncio.AbstractEventLoop, value: T) -> None:
        self._last = (weakref.ref(loop), value)

    def forget(self) -> None:
        self._last = (_gone, None)


def close_at_loop_shutdown(
    nodes: Callable[[], Iterable[Any]],
    registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any],
    loop: asyncio.AbstractEventLoop,
) -> AsyncGenerator[None, None]:
    """Close the pools of ``loop`` of the ``nodes()`` (``Node`` objects) when the loop
    shuts down, and drop ``loop`` from ``registry`` (where the caller keeps what this
    returns).

    An event loop has no shutdown callback, but ``shutdown_asyncgens()`` (called by
    ``asyncio.run`` and by test runners) closes every async generator started on it, so
    we start one whose ``finally`` does the clean-up. It holds the nodes' source, not the
    backend: a backend dropped before its loop ends still has its connections closed (the
    loop finalizes the generator once nothing else references it). The backend keeps the
    generator referenced while it lives.
    """
    closers = weakref.ref(registry)

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            # These entries reference the loop they are keyed by: drop them, or neither
            # they nor the loop could ever be collected.
            entries = closers()
            if entries is not None:
                entries.pop(loop, None)
            for node in nodes():
                pool = node.drop_async_pool(loop)
                if pool is not None:
                    await pool.close()

    generator = closer()
    # Run it to its first `yield` without awaiting (it awaits nothing before), which
    # registers it with the running loop's async-generator hooks.
    with contextlib.suppress(StopIteration):
        generator.asend(None).send(None)
    return generator
