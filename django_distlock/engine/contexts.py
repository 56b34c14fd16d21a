"""``with`` and ``async with``, once for :class:`~.lock.Lock` and
:class:`~.many.LockGroup`: entering acquires (or raises what ``_not_acquired()`` makes),
leaving hands the body's exception to the class's own ``_leave``/``_aleave``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from .exceptions import LockNotAcquired

__all__ = ["ExcInfo", "LockContext"]

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
"""What ``__exit__`` is told of the body's exception (three ``None`` when it raised none)."""


class LockContext:
    """The context-manager protocol on top of a class's ``acquire``/``aacquire`` and its
    ``_leave``/``_aleave``."""

    def acquire(self) -> bool:
        raise NotImplementedError

    async def aacquire(self) -> bool:
        raise NotImplementedError

    def _not_acquired(self) -> LockNotAcquired:
        raise NotImplementedError

    def _leave(self, exc_info: ExcInfo) -> None:
        raise NotImplementedError

    async def _aleave(self, exc_info: ExcInfo) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave((exc_type, exc, tb))

    async def __aenter__(self) -> Self:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._aleave((exc_type, exc, tb))
