"""What ``min_replicas="auto"`` knows of each primary's replicas, and the ``WAIT`` an
acquire sends because of it. Free of I/O: the drivers read ``ROLE`` when
:meth:`ReplicaCounts.due` says so and hand the reply to :meth:`ReplicaCounts.learn`.

"auto" waits for one replica where the primary serving the lock reported a connected
replica, and for none where it reported none. The count is read with ``ROLE`` the first
time a server is used, then again at most every ``Tuning.replica_check`` seconds (that
one acquire pays a round trip more; the others none). A primary that reported a replica
keeps being waited on for ``Tuning.replica_grace`` seconds after it last did: a planned
failover first takes the replica away from the old primary (promoted, it drops its link),
and the old primary keeps granting until it is demoted; an acquire it grants then is
exactly the one a failover forgets.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from .keys import AUTO_REPLICAS
from .ops import Call
from .tuning import Tuning

__all__ = ["ReplicaCounts", "connected_replicas", "resolved", "wants_reading"]

logger = logging.getLogger("django_distlock")


def connected_replicas(role: Any) -> int | None:
    """How many replicas a ``ROLE`` reply lists: ``0`` for a node that is not a primary,
    ``None`` when the reply is not a ``ROLE`` reply (an error, a refused command)."""
    if not isinstance(role, list | tuple) or not role:
        return None
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    if kind != "master":
        return 0
    if len(role) < 3 or not isinstance(role[2], list | tuple):
        return None
    return len(role[2])


@dataclass(slots=True)
class _Reading:
    replicas: int = 0
    """What the server reported at its last reading."""
    read_at: float = -1.0
    """Monotonic time of the last reading asked for (whatever its answer)."""
    seen_replica_at: float | None = None
    """Monotonic time of the last reading that listed a replica."""


class ReplicaCounts:
    """The replicas of each primary as ``"auto"`` knows them, by server name, shared by a
    backend's sync and async drivers (and every event loop)."""

    def __init__(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self._readings: dict[str, _Reading] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def due(self, server: str, now: float | None = None) -> bool:
        """Whether ``server``'s replicas should be read (``ROLE``) before the next
        acquire on it: never read, or last read ``Tuning.replica_check`` seconds ago.
        Claims the reading, so that concurrent acquires do not all read it."""
        now = time.monotonic() if now is None else now
        with self._lock:
            reading = self._readings.get(server)
            if reading is None:
                self._readings[server] = _Reading(read_at=now)
                return True
            if now - reading.read_at < self.tuning.replica_check:
                return False
            reading.read_at = now
            return True

    def learn(self, server: str, role: Any, now: float | None = None) -> None:
        """Record ``server``'s ``ROLE`` reply (or the error that answered it: a server
        that refuses ``ROLE`` is taken to have no replica, and a warning logged once)."""
        now = time.monotonic() if now is None else now
        count = connected_replicas(role)
        if count is None:
            if server not in self._refused:
                self._refused.add(server)
                logger.warning(
                    "django-distlock: %s did not answer ROLE (%r), so MIN_REPLICAS 'auto' "
                    "cannot see its replicas and waits for none; set MIN_REPLICAS to a "
                    "number to wait for replicas there",
                    server,
                    role,
                )
            count = 0
        with self._lock:
            reading = self._readings.setdefault(server, _Reading(read_at=now))
            reading.replicas = count
            if count:
                reading.seen_replica_at = now

    def required(self, server: str, now: float | None = None) -> int:
        """How many replicas an acquire on ``server`` waits for under ``"auto"``: 1 if it
        reported a replica within the last ``Tuning.replica_grace`` seconds, else 0."""
        now = time.monotonic() if now is None else now
        reading = self._readings.get(server)
        if reading is None:
            return 0
        if reading.replicas:
            return 1
        seen = reading.seen_replica_at
        return int(seen is not None and now - seen < self.tuning.replica_grace)

    def forget(self) -> None:
        """Forget every reading (they are read again on next use)."""
        with self._lock:
            self._readings.clear()


def wants_reading(request: Any) -> bool:
    """True for a script call whose replicas are ``"auto"`` (resolved per server)."""
    return (
        type(request) is Call
        and request.replicas is not None
        and request.replicas[0] == AUTO_REPLICAS
    )


def resolved(request: Call, count: int) -> Call:
    """``request`` waiting for ``count`` replicas (no ``WAIT`` at all for 0)."""
    assert request.replicas is not None
    if not count:
        return dataclasses.replace(request, replicas=None)
    return dataclasses.replace(request, replicas=(count, request.replicas[1]))
