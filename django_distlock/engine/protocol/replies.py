"""Script replies read back, each into a small named type (:class:`Taken`, :class:`Busy`,
:class:`OtherKind`, :class:`TakenMany`, :class:`BusyMany`, :class:`Released`): the steps
read fields, never positions. Every reply that means "taken" is tagged, and a reply of
any other shape is an error, never a hold: a stray integer or ``OK`` cannot be mistaken
for a lock."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..exceptions import LockBackendError

__all__ = [
    "Busy",
    "BusyMany",
    "OtherKind",
    "Released",
    "Taken",
    "TakenMany",
    "acquire_reply",
    "many_reply",
    "passed_on_reply",
    "released_reply",
    "replication_report",
    "reply_tag",
    "unexpected",
]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def reply_tag(reply: Any) -> str | None:
    """The tag of a tagged script reply (its first element, or the first word of a string
    reply), ``None`` for anything else."""
    if isinstance(reply, list) and reply and isinstance(reply[0], bytes | str):
        return _text(reply[0])
    if isinstance(reply, bytes | str):
        return _text(reply).partition(" ")[0]
    return None


def unexpected(name: str, what: str, reply: Any) -> LockBackendError:
    """The error for a script reply of the wrong shape: never taken for an answer."""
    return LockBackendError(
        f"unexpected reply to {what} of lock {name!r}: {reply!r}; nothing was assumed held",
        name=name,
    )


class Taken(NamedTuple):
    """An acquire that took the lock (or found it held with this token already)."""

    fence: int
    acquired_at_us: int
    also_wake: Any = b""
    """A waiter to wake as well (a free slot or a shared hold may let one more in), or
    empty."""


class Busy(NamedTuple):
    """An acquire that found the lock held by someone else."""

    wait_ms: int
    """How long the obstacle lasts at most (the holder's PTTL), -1 if unknown."""
    head: Any
    """A fair waiter whose turn it is, for the caller to wake, or empty."""
    writer: bool
    """The caller now waits among the writers of a lock held shared (``PASS_ON`` takes
    it off)."""


class OtherKind(NamedTuple):
    """An acquire refused because the lock is held as another kind."""

    held_as: Any
    """The kind it is held as (``'limited N'``, ``'shared'``)."""


def acquire_reply(name: str, reply: Any) -> Taken | Busy | OtherKind:
    """What the reply of ``ACQUIRE`` or ``HOLDER_ACQUIRE`` says: ``taken FENCE [AT]``
    (``AT`` given only when it differs from the fence) or ``{'taken', fence, at, head}``;
    ``{'busy', wait_ms, head[, writer]}``; ``{'kind', kind}``. Anything else is a
    :class:`LockBackendError`, never a hold."""
    tag = reply_tag(reply)
    try:
        if tag == "taken":
            if isinstance(reply, list) and len(reply) >= 3:
                also_wake = reply[3] if len(reply) > 3 else b""
                return Taken(int(reply[1]), int(reply[2]), also_wake)
            if isinstance(reply, bytes | str):
                words = _text(reply).split()
                fence = int(words[1])
                return Taken(fence, int(words[2]) if len(words) > 2 else fence)
        elif tag == "busy" and isinstance(reply, list) and len(reply) >= 3:
            return Busy(int(reply[1]), reply[2], len(reply) > 3 and reply[3] in (b"1", "1"))
        elif tag == "kind" and isinstance(reply, list) and len(reply) == 2:
            return OtherKind(reply[1])
    except (ValueError, TypeError, IndexError):
        pass  # a field of the wrong type: the reply is of no known shape
    raise unexpected(name, "an acquire", reply)


class TakenMany(NamedTuple):
    """``MANY_ACQUIRE`` took every name (or found them held with this token already)."""

    acquired_at_us: int
    fences: list[int]
    """Each name's fence, in the order of the script's keys."""


class BusyMany(NamedTuple):
    """``MANY_ACQUIRE`` found one of the names held by someone else; nothing was taken."""

    wait_ms: int
    """That lock's remaining lease, -1 if unknown."""
    index: int
    """Which of the names it is (0 for the first)."""
    writer: bool
    """The caller now waits among its writers (it is held shared)."""


def many_reply(name: str, reply: Any) -> TakenMany | BusyMany:
    """What the reply of ``MANY_ACQUIRE`` says: ``{'taken', at, fence1, fence2, ...}`` or
    ``{'busy', wait_ms, i, writer}`` (``i`` counted from 1); anything else is a
    :class:`LockBackendError`."""
    tag = reply_tag(reply)
    try:
        if tag == "taken" and isinstance(reply, list) and len(reply) >= 3:
            return TakenMany(int(reply[1]), [int(fence) for fence in reply[2:]])
        if tag == "busy" and isinstance(reply, list) and len(reply) == 4:
            return BusyMany(int(reply[1]), int(reply[2]) - 1, reply[3] in (b"1", "1"))
    except (ValueError, TypeError):
        pass  # a field of the wrong type: the reply is of no known shape
    raise unexpected(name, "an acquire", reply)


class Released(NamedTuple):
    """What a release, or a waiter leaving (``PASS_ON``), found and left to do."""

    released: bool
    """The hold was there and is gone (``False``: it was not held, or nothing to release)."""
    head: Any
    """A fair waiter for the caller to wake, or empty."""


def passed_on_reply(name: str, reply: Any) -> Released:
    """What ``PASS_ON``'s reply ``{1, head}`` says; anything else is a
    :class:`LockBackendError`."""
    if isinstance(reply, list) and len(reply) == 2:
        return Released(True, reply[1])
    raise unexpected(name, "leaving the wait", reply)


def released_reply(name: str, reply: Any) -> Released:
    """``(released, head)`` from a release's reply ``released``/``not held`` or
    ``{'released' | 'not held', head}`` (``head``: a fair waiter to wake, or empty)."""
    head: Any = b""
    if isinstance(reply, list) and len(reply) == 2:
        reply, head = reply
    outcome = _text(reply) if isinstance(reply, bytes | str) else None
    if outcome == "released":
        return Released(True, head)
    if outcome == "not held":
        return Released(False, head)
    raise unexpected(name, "a release", reply)


def replication_report(role: Any) -> str:
    """What a primary's ``ROLE`` reply says of its replicas, for an error message:
    ``" (the primary has 2 connected replicas, 1,234 bytes behind at most)"``."""
    if not isinstance(role, list | tuple) or len(role) < 3:
        return ""
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    if kind != "master":
        return f" (the node answering is a {kind}, not a primary)"
    offset, replicas = int(role[1]), role[2]
    if not replicas:
        return " (the primary has no connected replica)"
    behind = max(offset - int(replica[2]) for replica in replicas)
    count = len(replicas)
    return (
        f" (the primary has {count} connected replica{'s' if count != 1 else ''}, "
        f"{behind:,} bytes behind at most)"
    )
