"""The names of things: the three modes a lock is held in, the validation of user input
(names, contexts, durations, limits, replicas, prefixes) and the Redis key layout of a
lock (:class:`LockKeys`)."""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUTO_REPLICAS",
    "BUCKETS",
    "ENGINE_KINDS",
    "EXCLUSIVE",
    "FORCED_CHANNEL",
    "LIMITED",
    "MAX_CONTEXT_LENGTH",
    "MAX_LIMIT",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "MAX_SECONDS",
    "MODES",
    "SHARED",
    "LockKeys",
    "bucket_of",
    "clean_label",
    "holder_index_keys",
    "index_key",
    "index_keys",
    "lock_key",
    "validate_context",
    "validate_limit",
    "validate_name",
    "validate_prefix",
    "validate_replicas",
    "validate_seconds",
]


EXCLUSIVE = "exclusive"
"""A hold nobody else may have at the same time (the default)."""
SHARED = "shared"
"""A shared (read) hold: any number at once, none together with an exclusive one."""
LIMITED = "limited"
"""One of at most ``limit`` holds at once."""
MODES = (EXCLUSIVE, SHARED, LIMITED)


MAX_NAME_LENGTH = 512
MAX_REPLICAS = 64
"""The most replicas a lock may wait for (``min_replicas``)."""
AUTO_REPLICAS = "auto"
"""``min_replicas`` that waits for one replica where the lock's primary has one, and for
none where it has none (:mod:`.transport.replication`)."""
MAX_CONTEXT_LENGTH = 255
"""Characters of a context label and of an owner's host and thread (the size of their
``LockEvent`` columns)."""

# One year. Every duration becomes milliseconds that the scripts add to the server
# clock (about 1.8e12 ms today): the sum stays an exact integer in Lua's doubles (2**53)
# and far below the overflow of Redis's PX/PEXPIRE (2**63 ms), and the renewer's timed
# waits stay within what the OS accepts. Leases or waits longer than that are mistakes.
MAX_SECONDS = 365 * 24 * 3600


FORCED_CHANNEL = "force-released"
"""The channel of force-release notices, under the backend's key prefix."""


def validate_name(name: Any, argument: str = "name") -> str:
    """Return ``name`` if it is a usable lock name, else raise ``TypeError``/``ValueError``.

    A name is a non-empty ``str`` of at most 512 characters (code points) with no NUL.
    """
    if isinstance(name, str) and not name:
        raise ValueError(f"{argument} must not be empty")
    return _stored_text(name, argument, MAX_NAME_LENGTH)


def validate_context(value: Any, argument: str = "context") -> str:
    """Return ``value`` if it is a usable context label, else raise ``TypeError``/
    ``ValueError``.

    A context is a ``str`` (possibly empty) of at most 255 characters with no NUL, that
    UTF-8 can encode: it is stored with the lock in Redis and in ``LockEvent.context``,
    and a value the database refuses would cost the events written with it.
    """
    return _stored_text(value, argument, MAX_CONTEXT_LENGTH)


def _stored_text(value: Any, argument: str, max_length: int) -> str:
    """``value`` if it is a ``str`` of at most ``max_length`` characters, without NUL,
    that UTF-8 can encode (what Redis and the database store)."""
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")
    if len(value) > max_length:
        raise ValueError(f"{argument} must be at most {max_length} characters, not {len(value)}")
    if "\x00" in value:
        raise ValueError(f"{argument} must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"{argument} must be encodable as UTF-8 ({exc.reason})") from None
    return value


def clean_label(text: str, limit: int = MAX_CONTEXT_LENGTH) -> str:
    """``text`` without NUL and lone surrogates, cut to ``limit`` characters: a label we
    did not choose (a thread or task name, the host name, a file name decoded with
    ``surrogateescape``) made fit to store, where refusing it would break the lock.

    >>> clean_label("worker\\x00-\\udcff1")
    'worker-1'
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="ignore").decode()
    return text[:limit]


def validate_seconds(
    value: Any, argument: str, *, allow_zero: bool = False, maximum: float = MAX_SECONDS
) -> float:
    """Return ``value`` as a float number of seconds, rejecting non-numbers (including
    ``bool``), non-finite values, negatives, zero (unless ``allow_zero``) and anything
    above ``maximum`` (default :data:`MAX_SECONDS`, one year)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}")
    # Compared before float(): an int too large for a float must be refused, not overflow.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{argument} must be finite, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or positive" if allow_zero else "positive"
        raise ValueError(f"{argument} must be {bound}, not {_shown(value)}")
    if not allow_zero and value < 0.001:
        raise ValueError(f"{argument} must be at least 0.001 seconds, not {value!r}")
    if value > maximum:
        raise ValueError(
            f"{argument} must be at most {maximum:.0f} seconds ({maximum / 86400:g} days), "
            f"not {_shown(value)}"
        )
    return float(value)


def _shown(value: int | float) -> str:
    """``repr(value)``, except for ints too long to print usefully (or at all: Python
    refuses to print ints of more than 4300 digits)."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


MAX_LIMIT = 10_000
"""The most holders a limited lock may admit at once (``limit``)."""


def validate_limit(value: Any, argument: str = "limit") -> int:
    """Return ``value`` if it is a usable holder limit (an ``int``, 1 to 10,000), else
    raise ``TypeError``/``ValueError`` naming ``argument``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"{argument} must be between 1 and {MAX_LIMIT:,}, not {value}")
    return value


def validate_replicas(value: Any, argument: str) -> int | str:
    """Return ``value`` if it says how many replicas to wait for (:data:`AUTO_REPLICAS`,
    or an ``int`` from 0 to 64), else raise ``TypeError``/``ValueError`` naming
    ``argument``."""
    if value == AUTO_REPLICAS and isinstance(value, str):
        return AUTO_REPLICAS
    if isinstance(value, str):
        raise ValueError(
            f"{argument} must be {AUTO_REPLICAS!r} or an int from 0 to {MAX_REPLICAS}, "
            f"not {value!r}"
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{argument} must be {AUTO_REPLICAS!r} or an int, not {type(value).__name__}"
        )
    if not 0 <= value <= MAX_REPLICAS:
        raise ValueError(f"{argument} must be between 0 and {MAX_REPLICAS}, not {value}")
    return value


def validate_prefix(prefix: Any) -> str:
    """Return ``prefix`` if it can start every key of this package, else raise.

    Braces are refused: they would put a Cluster hash tag in the prefix and move every
    lock into one slot.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        raise ValueError("prefix must not be empty: lock keys must not mix with other keys")
    if "{" in prefix or "}" in prefix or "\x00" in prefix:
        raise ValueError(f"prefix must not contain '{{', '}}' or NUL, got {prefix!r}")
    return prefix


BUCKETS = 256
"""Locks are spread over this many buckets. A bucket is a Redis Cluster hash tag: every key
of a lock carries its bucket's tag, so a lock's keys share one slot, its bucket's index
lives in that slot too, and the buckets spread the locks over a cluster's primaries.
Part of the key layout: changing it moves every lock to other keys."""

ENGINE_KINDS = frozenset(
    (
        "lock",
        "fence",
        "waiting",
        "index",
        "queue",
        "queue-deadlines",
        "signal",
        "wake",
        "holders",
        "writers",
        "holder-index",
    )
)
"""The kinds of key the engine writes in a bucket (``PREFIX{bb}:KIND...``)."""
_KIND = re.compile(r"[a-z0-9][a-z0-9-]*")

_BUCKET_TAGS = tuple(f"{{{bucket:02x}}}" for bucket in range(BUCKETS))


def bucket_of(name: str) -> int:
    """The bucket of lock ``name``: a stable hash of its UTF-8 bytes (CRC-32, the same in
    every process and version) modulo :data:`BUCKETS`."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % BUCKETS


def index_key(prefix: str, bucket: int) -> str:
    """The listing index of ``bucket`` under ``prefix``: a sorted set of the held locks'
    names (score: lease end, server ms)."""
    return f"{prefix}{_BUCKET_TAGS[bucket]}:index"


def index_keys(prefix: str) -> tuple[str, ...]:
    """Every bucket's listing index under ``prefix``, in bucket order."""
    return tuple(f"{prefix}{tag}:index" for tag in _BUCKET_TAGS)


def holder_index_keys(prefix: str) -> tuple[str, ...]:
    """Every bucket's listing index of shared and limited holds, in bucket order."""
    return tuple(f"{prefix}{tag}:holder-index" for tag in _BUCKET_TAGS)


def lock_key(prefix: str, name: str) -> str:
    """The key holding lock ``name`` under ``prefix`` (``LockKeys.for_name(...).lock``,
    without building the other keys: listings compute thousands of these)."""
    return f"{prefix}{_BUCKET_TAGS[bucket_of(name)]}:lock:{name}"


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The keys of one lock, in the order the scripts expect them (``KEYS[1..6]``, plus a
    waiter's own wake-up list).

    ``PREFIX{bb}:lock:NAME`` is the lock itself, ``bb`` its bucket (two hex digits).
    Every key names its kind before the lock's name, so no name can be mistaken for
    another key's ("a:fence" is ``PREFIX{bb}:lock:a:fence``, never the fence of "a"),
    and the only braces in a key are the bucket's tag (the prefix may hold none), so the
    tag is always the first ``{...}`` Redis Cluster hashes, whatever braces a name holds.

    >>> keys = LockKeys.for_name("distlock:", "invoice:42")
    >>> keys.lock, keys.index
    ('distlock:{ee}:lock:invoice:42', 'distlock:{ee}:index')
    >>> keys.wake("0123456789abcdef")
    'distlock:{ee}:wake:0123456789abcdef:invoice:42'
    """

    lock: str
    fence: str
    waiters: str
    """Who waits for the lock: a sorted set of waiter ids, each scored with the server
    time (ms) until which it counts as waiting."""
    index: str
    queue: str
    queue_deadlines: str
    signal: str
    holders: str
    """Shared and limited holds: each holder's fence, start, lease and owner by token
    (while the lock key is a sorted set of tokens; see :mod:`.protocol.scripts`)."""
    writers: str
    """Exclusive waiters of a lock held shared, who go before new shared holders."""
    holder_index: str
    """The bucket's listing index of shared and limited holds (member: name NUL token)."""
    bucket: int
    name: str
    tag_prefix: str

    @classmethod
    def for_name(cls, prefix: str, name: str) -> LockKeys:
        """The keys of lock ``name`` under ``prefix`` (both already validated)."""
        bucket = bucket_of(name)
        base = f"{prefix}{_BUCKET_TAGS[bucket]}:"
        return cls(
            lock=f"{base}lock:{name}",
            fence=f"{base}fence:{name}",
            waiters=f"{base}waiting:{name}",
            index=f"{base}index",
            queue=f"{base}queue:{name}",
            queue_deadlines=f"{base}queue-deadlines:{name}",
            signal=f"{base}signal:{name}",
            holders=f"{base}holders:{name}",
            writers=f"{base}writers:{name}",
            holder_index=f"{base}holder-index",
            bucket=bucket,
            name=name,
            tag_prefix=base,
        )

    def all(self, waiter: str = "") -> tuple[str, ...]:
        """The keys a lock script takes (``KEYS[1..10]``): the six of the lock, then
        ``waiter``'s own wake-up list (or the shared signal list when there is no
        waiter), the signal list, the holders' hash and the waiting writers."""
        return (
            self.lock,
            self.fence,
            self.waiters,
            self.index,
            self.queue,
            self.queue_deadlines,
            self.wake(waiter) if waiter else self.signal,
            self.signal,
            self.holders,
            self.writers,
        )

    def of_holders(self, waiter: str = "") -> tuple[str, ...]:
        """The keys of a shared or limited hold's scripts: :meth:`all`, with the
        bucket's index of such holds as ``KEYS[4]``."""
        keys = self.all(waiter)
        return (*keys[:3], self.holder_index, *keys[4:])

    def beside(self, kind: str) -> str:
        """A key of another ``kind`` in this lock's slot, ``PREFIX{bb}:KIND:NAME``: state
        that a layer built on locks keeps per lock name (the Celery integration's queue
        claims), so that one script can touch it together with the lock's own keys.

        ``kind`` is lowercase letters, digits and ``-``, and none of the engine's own
        kinds, so no such key can be taken for a lock's:

        >>> LockKeys.for_name("distlock:", "invoice:42").beside("celery-claim")
        'distlock:{ee}:celery-claim:invoice:42'
        """
        if not _KIND.fullmatch(kind) or kind in ENGINE_KINDS:
            raise ValueError(f"{kind!r} cannot name a kind of key beside a lock")
        return f"{self.tag_prefix}{kind}:{self.name}"

    def wake(self, waiter: str) -> str:
        """The wake-up list of waiter ``waiter`` (an id of 16 hex digits): a fair waiter
        blocks on it alone, an unfair one on it and the shared ``signal`` list."""
        return f"{self.tag_prefix}wake:{waiter}:{self.name}"
