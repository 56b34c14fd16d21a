"""The one exception tree every lock failure belongs to."""

from __future__ import annotations

__all__ = [
    "LockBackendUnavailable",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
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
    """Redis could not be reached or answered with an error; no lock state was changed
    that the caller could rely on."""
