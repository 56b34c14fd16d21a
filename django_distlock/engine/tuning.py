"""Timing knobs of the waiting and renewal protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .keys import MAX_SECONDS

__all__ = ["Tuning", "ms"]


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds for Redis, rounded up (never 0)."""
    return max(1, math.ceil(seconds * 1000))


@dataclass(frozen=True, slots=True)
class Tuning:
    """Timing knobs of the waiting and renewal protocol (seconds)."""

    wait_cap: float = 1.0
    """Longest a waiter sleeps before re-checking, whatever the holder's lease. It bounds
    the cost of a lost wake-up and is how often a fair waiter confirms it is alive."""
    waiter_liveness: float = 3.0
    """How long a fair waiter keeps its place in the queue without confirming."""
    fence_memory: float = 3600.0
    """How long a lock's fence counter outlives the lease of its last acquisition. Each
    fence is ``max(counter + 1, server clock in µs)``, so the counter only matters while
    the server clock could step back below the last fence; after it lapses the next
    fence comes from the clock alone. One key of about 100 bytes per lock name lives
    this long."""
    server_wait: float = 30.0
    """Server-side timeout of one outstanding ``BLPOP``. Waking up is timed by the
    client (see ``AwaitWakeUp``); this only cleans up after a vanished client."""
    renewal_attempt: float = 1.0
    """Longest one renewal attempt may take (at most half of what is left of the lease).
    A renewal that gets no answer in time is retried on a fresh connection while the
    lease lasts."""
    connection_wait: float = 5.0
    """Longest a request waits for a connection of the client's pool when the pool is at
    its ``max_connections``; then it raises ``LockBackendUnavailable`` naming that cap.
    Requests never open connections past it (blocking waits and renewals have a pool of
    their own)."""
    failover_ride_out: float = 10.0
    """Longest a waiter whose wait a failover ended (``UNBLOCKED``) keeps trying while the
    new primary settles (never past its ``blocking_timeout``); an attempt that still
    fails then raises ``LockBackendUnavailable``."""
    failover_pause: float = 0.05
    """Seconds between two such attempts."""
    replica_check: float = 1.0
    """How often ``min_replicas="auto"`` reads a primary's replicas again (``INFO
    replication``, one request per server at most this often, before the acquire that
    finds it due)."""
    replica_grace: float = 10.0
    """How long ``"auto"`` keeps waiting for a replica after the server last reported
    one: a planned failover takes the replica away from the old primary first, and the
    old primary keeps granting until it is demoted (Sentinel does it about 10 s later)."""
    fence_memory_ms: int = field(init=False)
    waiter_liveness_ms: int = field(init=False)

    def __post_init__(self) -> None:
        for name in _KNOBS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Tuning.{name} takes seconds (a number), not {value!r}")
            if not 0 <= value <= MAX_SECONDS or (value == 0 and name not in _MAY_BE_0):
                least = "0" if name in _MAY_BE_0 else "more than 0"
                raise ValueError(
                    f"Tuning.{name} must be {least} to {MAX_SECONDS} seconds, not {value!r}"
                )
        if self.wait_cap >= self.waiter_liveness:
            # A fair waiter confirms its place at least every wait_cap seconds.
            raise ValueError(
                f"Tuning.waiter_liveness ({self.waiter_liveness} s) must be longer than "
                f"wait_cap ({self.wait_cap} s): a fair waiter's place would lapse between "
                "two of its confirmations"
            )
        object.__setattr__(self, "fence_memory_ms", ms(self.fence_memory))
        object.__setattr__(self, "waiter_liveness_ms", ms(self.waiter_liveness))


_KNOBS = tuple(name for name in Tuning.__dataclass_fields__ if not name.endswith("_ms"))
_MAY_BE_0 = frozenset({"fence_memory", "failover_ride_out", "replica_grace"})
"""Knobs for which 0 turns something off (no counter memory, no ride-out, no grace)."""
