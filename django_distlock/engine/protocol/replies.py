"""Script replies read back. Every reply that means "taken" is tagged
(:func:`taken_reply`), and a reply of any other shape is an error, never a hold: a stray
integer or ``OK`` cannot be mistaken for a lock."""

from __future__ import annotations

from typing import Any

from ..exceptions import LockBackendError

__all__ = [
    "released_reply",
    "replication_report",
    "reply_tag",
    "taken_reply",
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


def taken_reply(name: str, reply: Any) -> tuple[int, int] | None:
    """``(fence, acquired_at_us)`` from an acquire's reply ``taken FENCE [AT]`` (``AT``
    given only when it differs from the fence), or from ``{'taken', fence, at, ...}``;
    ``None`` for a tagged refusal; :class:`LockBackendError` for anything else."""
    tag = reply_tag(reply)
    if tag == "taken":
        if isinstance(reply, list):
            return int(reply[1]), int(reply[2])
        words = _text(reply).split()
        fence = int(words[1])
        return fence, int(words[2]) if len(words) > 2 else fence
    if tag in ("busy", "kind"):
        return None
    raise unexpected(name, "an acquire", reply)


def released_reply(name: str, reply: Any) -> tuple[bool, Any]:
    """``(released, head)`` from a release's reply ``released``/``not held`` or
    ``{'released' | 'not held', head}`` (``head``: a fair waiter to wake, or empty)."""
    head: Any = b""
    if isinstance(reply, list) and len(reply) == 2:
        reply, head = reply
    outcome = _text(reply) if isinstance(reply, bytes | str) else None
    if outcome == "released":
        return True, head
    if outcome == "not held":
        return False, head
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
