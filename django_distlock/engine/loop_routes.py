"""The routes of each event loop: redis-py's asyncio clients and connections belong to the
loop that opened them, so each loop gets routes of its own, made from the backend's async
client factory when it first needs them and closed when it shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from .servers import AsyncRoutes

__all__ = ["LoopRoutes", "close_with_loop"]


def close_with_loop(
    loop: asyncio.AbstractEventLoop,
    close: Callable[[], Awaitable[None]],
) -> AsyncGenerator[None, None]:
    """Run ``close()`` when ``loop`` shuts down; returns what the caller keeps alive for as
    long as the loop's connections may need closing.

    An event loop has no shutdown callback, but ``shutdown_asyncgens()`` (called by
    ``asyncio.run``, asgiref's ``async_to_sync`` and test runners) finalizes every async
    generator started on it, so one is started here whose ``finally`` closes what the loop
    opened: redis-py's asyncio connections belong to their loop and cannot be closed from
    another one.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await close()

    generator = closer()
    # Run it to its first `yield` (it awaits nothing before), which registers it with the
    # running loop's async-generator hooks.
    with contextlib.suppress(StopIteration):
        generator.asend(None).send(None)
    assert loop is asyncio.get_running_loop()
    return generator


class LoopRoutes:
    """The :class:`AsyncRoutes` of each event loop, made by ``make()`` when a loop first
    needs them and closed when it shuts down (or by :meth:`aclose`)."""

    def __init__(self, make: Callable[[], AsyncRoutes]) -> None:
        self.make = make
        self._routes: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[AsyncRoutes, asyncio.Future[None], Any]
        ] = weakref.WeakKeyDictionary()

    async def get(self) -> AsyncRoutes:
        """The running loop's routes (its cluster slot map read)."""
        loop = asyncio.get_running_loop()
        while True:
            entry = self._routes.get(loop)
            if entry is None:
                break
            routes, started, _ = entry
            if not started.done():
                # Another task is reading the slot map: wait for it (and if it failed,
                # try again here). asyncio.wait never raises for what it waits on: a
                # CancelledError from it is this task's own, and goes on up.
                await asyncio.wait({started})
            if started.cancelled():
                continue
            return routes
        routes = self.make()
        started = loop.create_future()
        closer = close_with_loop(loop, lambda: self._closed(loop, routes))
        self._routes[loop] = (routes, started, closer)
        try:
            await routes.prepare()
        except BaseException:
            self._routes.pop(loop, None)
            started.cancel()
            await routes.aclose()
            raise
        started.set_result(None)
        return routes

    async def _closed(self, loop: asyncio.AbstractEventLoop, routes: AsyncRoutes) -> None:
        entry = self._routes.get(loop)
        if entry is not None and entry[0] is routes:
            del self._routes[loop]
        await routes.aclose()

    async def aclose(self) -> None:
        """Close the running loop's routes."""
        entry = self._routes.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[0].aclose()

    def forget(self) -> None:
        """Forget every loop's routes without closing them (a forked child must not touch
        its parent's sockets)."""
        self._routes = weakref.WeakKeyDictionary()
