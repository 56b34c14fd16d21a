"""What ``min_replicas="auto"`` knows of each primary's replicas, and the ``WAIT`` an
acquire sends because of it. Free of I/O: the drivers send :data:`READ_REPLICAS` when
:meth:`ReplicaCounts.due` says so, hand the reply to :meth:`ReplicaCounts.learn`, and
report a server they could not reach (:meth:`ReplicaCounts.lost`).

"auto" waits for one replica where the primary serving the lock reported a replica in
sync (``state=online`` in ``INFO replication``), and for none where it reported none.
The count is read the first time a server is used, then again at most every
``Tuning.replica_check`` seconds (that one acquire pays a round trip more; the others
none).

A server that reported a replica keeps being waited on for ``Tuning.replica_grace``
seconds after it last did. A planned failover first promotes the replica, which drops
its link to the old primary, and the old primary keeps granting on the connections still
open to it until it is demoted (Sentinel does that some seconds later); an acquire it
grants then is exactly the one the failover forgets. Nothing the client sees tells that
apart from a primary whose replica died, or from a new primary behind the same name (a
Sentinel service, a DNS name) that has no replica yet while other connections still
reach the old one: a reading taken right after connections were cut may even come from a
primary whose replica a second failover just took. So the grace is a time, not a guess;
after a crash failover the new primary is waited on until the grace has passed (a
failure is detected after ``down-after-milliseconds``, 30 s by default, by then it has).
A connection that fails only makes the next acquire read the server again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..keys import AUTO_REPLICAS
from ..protocol.ops import Call
from ..tuning import Tuning

__all__ = [
    "READ_REPLICAS",
    "ReplicaCounts",
    "Replication",
    "replication_of",
    "resolved",
    "wants_reading",
]

logger = logging.getLogger("django_distlock")

READ_REPLICAS = ("INFO", "replication")
"""The command whose reply :meth:`ReplicaCounts.learn` reads."""


@dataclass(frozen=True, slots=True)
class Replication:
    """What ``INFO replication`` says of a server: its role, and how many replicas are
    in sync with it (``state=online``)."""

    role: str
    replicas: int


def replication_of(info: Any) -> Replication | None:
    """The :class:`Replication` in an ``INFO replication`` reply (text, as read from
    the connection), or ``None`` for any other reply (an error, a refused command)."""
    if isinstance(info, bytes):
        info = info.decode(errors="replace")
    if not isinstance(info, str):
        return None
    fields = dict(line.partition(":")[::2] for line in info.splitlines() if ":" in line)
    role = fields.get("role")
    if role is None:
        return None
    online = sum(
        1
        for name, value in fields.items()
        if name.startswith("slave") and name[5:].isdigit() and "state=online" in value
    )
    return Replication(role, online if role == "master" else 0)


@dataclass(slots=True)
class _Reading:
    replicas: int = 0
    """Replicas in sync at the last reading."""
    read_at: float = -1.0
    """Monotonic time of the last reading asked for (whatever its answer)."""
    seen_replica_at: float | None = None
    """Monotonic time of the last reading that listed a replica in sync."""


class ReplicaCounts:
    """The replicas of each primary as ``"auto"`` knows them, by server name, shared by a
    backend's sync and async drivers (and every event loop)."""

    def __init__(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self._readings: dict[str, _Reading] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def due(self, server: str, now: float | None = None) -> bool:
        """Whether ``server``'s replicas should be read (:data:`READ_REPLICAS`) before
        the next acquire on it: never read, or last read ``Tuning.replica_check`` seconds
        ago.
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

    def learn(self, server: str, info: Any, now: float | None = None) -> None:
        """Record ``server``'s reply to :data:`READ_REPLICAS` (or the error that answered
        it: a server that refuses it is taken to have no replica, and a warning logged
        once)."""
        now = time.monotonic() if now is None else now
        replication = replication_of(info)
        if replication is None:
            if server not in self._refused:
                self._refused.add(server)
                logger.warning(
                    "django-distlock: %s did not answer INFO replication (%r), so "
                    "MIN_REPLICAS 'auto' cannot see its replicas and waits for none; set "
                    "MIN_REPLICAS to a number to wait for replicas there",
                    server,
                    info,
                )
            replication = Replication("unknown", 0)
        with self._lock:
            reading = self._readings.setdefault(server, _Reading(read_at=now))
            reading.replicas = replication.replicas
            if replication.replicas:
                reading.seen_replica_at = now

    def lost(self, server: str) -> None:
        """A connection to ``server`` failed (the primary may have changed): read it
        again before the next acquire."""
        with self._lock:
            reading = self._readings.get(server)
            if reading is not None:
                reading.read_at = -math.inf

    def required(self, server: str, now: float | None = None) -> int:
        """How many replicas an acquire on ``server`` waits for under ``"auto"``: 1 if
        it reported a replica in sync within the last ``Tuning.replica_grace`` seconds
        (or at its last reading), else 0."""
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
