"""The one exception tree every lock failure belongs to."""

from __future__ import annotations

__all__ = [
    "LockBackendError",
    "LockBackendUnavailable",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockNotReplicated",
]


class LockError(Exception):
    """Root of every error a lock can raise; ``name`` is the lock's name (or ``None``)."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockNotAcquired(LockError):
    """Entering ``with``/``async with`` did not get the lock (busy, or the wait timed out).

    ``retry_after`` is the holder's remaining lease in seconds when it is known.
    """

    def __init__(
        self, message: str, *, name: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.retry_after = retry_after


class LockNotOwned(LockError):
    """Releasing, extending or querying a lock this thread or task does not hold."""


class LockLost(LockNotOwned):
    """The lock was held but its lease ended or another holder took it over.

    A subclass of ``LockNotOwned``: code that only cares that the caller no longer holds
    the lock can catch that; code that must react to losing it catches ``LockLost``.
    """


class LockBackendUnavailable(LockError):
    """Redis could not be reached, did not answer in time, or said it cannot serve
    writes right now (a replica during failover, loading, out of memory, cluster down);
    no lock state was changed that the caller could rely on. Retrying later may work."""


class LockNotReplicated(LockBackendUnavailable):
    """The lock was taken on the primary, but fewer replicas than ``min_replicas``
    acknowledged it within ``replica_timeout``: it was given back at once (a failover
    now could promote a replica without it). ``acknowledged`` and ``required`` say how
    many; the message says what the server reported about its replicas."""

    def __init__(
        self, message: str, *, name: str | None = None, acknowledged: int = 0, required: int = 0
    ) -> None:
        super().__init__(message, name=name)
        self.acknowledged = acknowledged
        self.required = required


class LockBackendError(LockError):
    """Redis answered with an error that retrying will not cure: a command refused by
    its ACL, a renamed or disabled command, a key of the wrong type under the lock
    prefix, a failing script. It points at a misconfiguration (or a bug), not an
    outage, so views do not answer it with 503."""
