"""A lock object's face on the caller's current acquisition: what is known of it (fence,
token, lease end, lost or not) and its lease in Redis (extend, reacquire, ttl, owned),
sync methods beside their async twins. :class:`~.lock.Lock` inherits it."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from .aio import AsyncDriver
from .arguments import check_bool
from .core import extend_call, ttl_call
from .hold import Hold, LostCause
from .holdings import Holdings
from .io import SyncDriver
from .keys import validate_seconds
from .losses import report_loss, tell
from .ops import Call
from .outcomes import lost_error
from .ownership import running_task

__all__ = ["CurrentAcquisition"]


class CurrentAcquisition:
    """The caller's acquisition of this lock object (the calling task's, else the
    calling thread's); see :class:`~.lock.Lock`."""

    name: str
    on_lost: Callable[[Any], Any] | None
    holdings: Holdings

    @property
    def fence(self) -> int | None:
        """The fencing token of the current acquisition (``None`` when not held).

        Strictly increasing per lock name; pass it to storage so that a write made by a
        holder that lost the lock can be refused (see ``fenced_update``).
        """
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.fence

    @property
    def token(self) -> str | None:
        """The random token identifying the current acquisition (``None`` when not held)."""
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.token

    @property
    def lost(self) -> bool:
        """True when the caller's last acquisition was lost: a renewal found the lock gone
        or re-owned, or its lease ended without a confirmed renewal. It keeps describing
        that acquisition after it ended (an ``except LockLost`` handler can read it),
        until the next acquire."""
        hold = self.holdings.find(running_task(), live=False)
        return hold is not None and hold.is_lost()

    @property
    def lost_reason(self) -> str:
        """Why the caller's last acquisition was lost (``""`` when it was not)."""
        hold = self.holdings.find(running_task(), live=False)
        if hold is None or not hold.is_lost():
            return ""
        return hold.lost_reason or "its lease ended"

    @property
    def valid_until(self) -> float | None:
        """When the lease of the current acquisition ends, as ``time.time()`` seconds
        (a conservative local estimate), or ``None`` when not held."""
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.valid_until

    @property
    def held(self) -> bool:
        """True while the caller holds an acquisition it has not lost."""
        hold = self.holdings.find(running_task())
        return hold is not None and not hold.is_lost()

    def extend(self, seconds: float, replace_ttl: bool = False) -> float:
        """Add ``seconds`` to the lease (or set it to ``seconds`` with ``replace_ttl``);
        return the new end of the lease as ``time.time()`` seconds."""
        hold, call = self._extend_call(seconds, replace_ttl, running_task())
        sent_at = time.monotonic()
        return self._extended(hold, SyncDriver(hold.backend, self.name).call(call), sent_at)

    def aextend(self, seconds: float, replace_ttl: bool = False) -> Coroutine[Any, Any, float]:
        """Async twin of :meth:`extend`."""
        return self._aextend(running_task(), seconds, replace_ttl)

    async def _aextend(self, owner: Any, seconds: Any, replace_ttl: Any) -> float:
        hold, call = self._extend_call(seconds, replace_ttl, owner or running_task())
        sent_at = time.monotonic()
        reply = await AsyncDriver(hold.backend, self.name).call(call)
        return self._extended(hold, reply, sent_at)

    def reacquire(self) -> float:
        """Reset the lease to the lock's full timeout; return its new end."""
        hold = self.holdings.owned(self.name, "reacquire", running_task())
        return self.extend(hold.lease, replace_ttl=True)

    def areacquire(self) -> Coroutine[Any, Any, float]:
        """Async twin of :meth:`reacquire`."""
        return self._areacquire(running_task())

    async def _areacquire(self, owner: Any) -> float:
        owner = owner or running_task()
        hold = self.holdings.owned(self.name, "reacquire", owner)
        return await self._aextend(owner, hold.lease, True)

    def _extend_call(self, seconds: Any, replace_ttl: Any, owner: Any) -> tuple[Hold, Call]:
        seconds = validate_seconds(seconds, "seconds")
        check_bool(replace_ttl, "replace_ttl")
        hold = self.holdings.owned(self.name, "extend", owner)
        if hold.is_lost():
            raise lost_error(hold)
        return hold, extend_call(hold, seconds, "set" if replace_ttl else "add")

    def _extended(self, hold: Hold, reply: Any, sent_at: float) -> float:
        if int(reply) < 0:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it", first=False)
            self._report_lost(hold)
            raise lost_error(hold)
        hold.valid_until_mono = sent_at + int(reply) / 1000
        tell(hold, "extended")
        return hold.valid_until

    def ttl(self) -> float | None:
        """Seconds left on the lease of the current acquisition, from Redis (``None`` when
        the caller does not hold it)."""
        hold = self.holdings.find(running_task())
        if hold is None:
            return None
        return self._ttl_from(hold, SyncDriver(hold.backend, self.name).call(ttl_call(hold)))

    def attl(self) -> Coroutine[Any, Any, float | None]:
        """Async twin of :meth:`ttl`."""
        return self._attl(running_task())

    async def _attl(self, owner: Any) -> float | None:
        hold = self.holdings.find(owner or running_task())
        if hold is None:
            return None
        reply = await AsyncDriver(hold.backend, self.name).call(ttl_call(hold))
        return self._ttl_from(hold, reply)

    def owned(self) -> bool:
        """True if Redis confirms the caller holds the lock."""
        return self.ttl() is not None

    def aowned(self) -> Coroutine[Any, Any, bool]:
        """Async twin of :meth:`owned`."""
        return self._aowned(running_task())

    async def _aowned(self, owner: Any) -> bool:
        return (await self._attl(owner)) is not None

    def _ttl_from(self, hold: Hold, reply: Any) -> float | None:
        pttl = int(reply)
        if pttl == -2:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it")
            self._report_lost(hold)
            return None
        return None if pttl < 0 else pttl / 1000

    def _report_lost(self, hold: Hold) -> None:
        report_loss(hold, self.on_lost, self)
