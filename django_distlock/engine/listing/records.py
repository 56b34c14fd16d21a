"""The value a held lock's key stores, read back: who holds it, since when, with what
fence and lease, and as which kind of hold.

Pure helpers (no I/O), so that every reader (the listing, ``HeldLock.objects``, the
admin, the CLI) decodes the layouts written by
:data:`~django_distlock.engine.protocol.scripts.ACQUIRE` (an exclusive hold) and
:data:`~django_distlock.engine.protocol.scripts.HOLDER_ACQUIRE` (a shared or limited hold) in one
place.

>>> record = parse_lock_value("invoice:42", b'ab12\\n7\\n1700000000000000\\n30000\\n'
...     b'{"host":"web1","pid":12,"thread":"MainThread","context":"","auto_renew":true}',
...     ttl_ms=2500)
>>> record.fence, record.host, record.ttl
(7, 'web1', 2.5)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..keys import EXCLUSIVE, LIMITED, SHARED

__all__ = [
    "LockRecord",
    "decode",
    "lock_value_acquired_at_us",
    "parse_kind",
    "parse_lock_value",
    "score_ms",
]


@dataclass(frozen=True, slots=True)
class LockRecord:
    """What Redis says about one hold of a lock: the only one of an exclusive lock, or one
    of the holds of a shared or limited lock (each has its own token, fence and lease).

    ``acquired_at_us`` is the server clock (epoch microseconds) when it was taken,
    ``lease`` its lease in seconds, ``ttl`` the seconds left when it was read. ``mode``
    is ``"exclusive"``, ``"shared"`` or ``"limited"``; ``limit`` how many holds a limited
    lock admits (``None`` for the other kinds); ``holders`` how many holds the lock had
    when it was read (``1`` for an exclusive lock).
    """

    name: str
    token: str
    fence: int
    acquired_at_us: int
    lease: float
    ttl: float
    host: str
    pid: int | None
    thread: str
    context: str
    auto_renew: bool
    mode: str = EXCLUSIVE
    limit: int | None = None
    holders: int = 1

    @property
    def acquired_at(self) -> float:
        """Epoch seconds (server clock) when the lock was taken."""
        return self.acquired_at_us / 1_000_000


def decode(value: bytes | str) -> str:
    """A reply from a client with or without ``decode_responses``, as ``str``."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def score_ms(score: bytes | str | float) -> int:
    """An index score (a lease end in ms), raw or parsed by the client, as an ``int``."""
    try:
        return int(score)  # whole milliseconds, which Redis prints without a fraction
    except ValueError:
        return int(float(score))


def parse_kind(kind: bytes | str | None) -> tuple[str, int | None]:
    """The mode and limit of a holders' hash's ``#kind`` field (``shared``, ``limited
    N``); a missing or unknown one reads as ``("shared", None)``.

    >>> parse_kind(b"limited 3"), parse_kind("shared")
    (('limited', 3), ('shared', None))
    """
    if kind is None:
        return SHARED, None
    mode, _, limit = decode(kind).partition(" ")
    if mode == LIMITED and limit.isdigit():
        return LIMITED, int(limit)
    return SHARED, None


def parse_lock_value(
    name: str,
    value: bytes | str | None,
    ttl_ms: float,
    *,
    mode: str = EXCLUSIVE,
    limit: int | None = None,
    holders: int = 1,
) -> LockRecord | None:
    """The lock key's value (``token \\n fence \\n acquired_at_us \\n lease_ms \\n
    owner_json``) as a :class:`LockRecord`; ``None`` when the key is gone or does not
    hold a value in that layout. A shared or limited hold's entry in the holders' hash
    reads the same once its token is put in front (``mode``, ``limit`` and ``holders``
    then describe the lock)."""
    if value is None:
        return None
    parts = decode(value).split("\n", 4)
    if len(parts) != 5:
        return None
    token, fence, acquired_at_us, lease_ms, owner_json = parts
    try:
        owner = json.loads(owner_json)
        if not isinstance(owner, dict):
            return None
        pid = owner.get("pid")
        return LockRecord(
            name=name,
            token=token,
            fence=int(fence),
            acquired_at_us=int(acquired_at_us),
            lease=int(lease_ms) / 1000,
            ttl=max(ttl_ms, 0) / 1000,
            host=str(owner.get("host", "")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            thread=str(owner.get("thread", "")),
            context=str(owner.get("context", "")),
            auto_renew=owner.get("auto_renew") is True,
            mode=mode,
            limit=limit,
            holders=holders,
        )
    except ValueError:
        return None


def lock_value_acquired_at_us(value: bytes | str | None) -> int | None:
    """Only the acquisition time (server epoch µs) of a lock key's value, cheaply: for
    sorting thousands of locks without decoding their owners."""
    if value is None:
        return None
    parts = value.split(b"\n" if isinstance(value, bytes) else "\n", 3)
    try:
        return int(parts[2])
    except (IndexError, ValueError):
        return None
