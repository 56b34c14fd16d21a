"""The locks held right now under a backend's prefix, read from Redis, and breaking one.

A :class:`Listing` answers a :class:`LockQuery` (name lookups, an order, a window) with
:class:`~django_distlock.engine.records.LockRecord` objects. ``HeldLock.objects``, the
admin, the ``distlock`` CLI and the benchmarks all list locks through it.

A page costs two round trips per node, whatever the size of the keyspace:

1. Each bucket's listing index (a sorted set: member = lock name, score = lease end in
   server ms; see :data:`~django_distlock.engine.keys.BUCKETS`) is pruned of the entries
   whose lease is over and read, by a script per bucket, the buckets of one node
   pipelined together (an exact or ``in`` lookup reads only its names' buckets). Name
   lookups and the order are applied to the names here.
2. One pipeline per node reads the values of the page's locks (``MGET`` per bucket, whose
   keys share a slot) and their lease ends (``ZMSCORE``); a lock released between the
   two reads is left out.

Ordering by ``acquired_at`` needs every matching lock's value: one more such read.
``KEYS`` and ``SCAN`` are never used, and only keys under the prefix are ever read.

>>> listing = Listing(backend)                                          # doctest: +SKIP
>>> [r.name for r in listing.records(LockQuery(filters=(("startswith", "invoice:"),)))]
... # doctest: +SKIP
['invoice:42']
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .backend import Backend
from .core import Call, release_steps
from .eviction import unsafe_eviction_policy
from .exceptions import LockError
from .io import BACKEND_ERRORS, SyncDriver
from .keys import BUCKETS, LockKeys, bucket_of, index_key, lock_key, validate_name
from .records import LockRecord, decode, lock_value_acquired_at_us, parse_lock_value, score_ms
from .scripts import LIST_INDEX

__all__ = ["EVERY_LOCK", "LOOKUPS", "MGET_CHUNK", "ORDER_FIELDS", "Listing", "LockQuery", "Page"]

MGET_CHUNK = 1000
"""Keys read per ``MGET`` or ``ZMSCORE`` (the chunks of one read go in one pipeline)."""
READ_TIMEOUT = 30.0
"""Seconds a listing waits for the answers of one node at most."""

LOOKUPS = ("exact", "startswith", "contains", "in")
"""How a :class:`LockQuery` can match names (plain string operations)."""
ORDER_FIELDS = ("name", "acquired_at", "ttl")
"""What a :class:`LockQuery` can order by (``-`` prefix for descending)."""

Raw = bytes | str
"""A name or value as the client returned it. Names stay raw until shown: UTF-8 bytes
sort and match like the names they encode."""

Filter = tuple[str, Any]
"""A name lookup: ``(lookup, value)``; the value is a ``frozenset`` for ``in``."""


@dataclass(frozen=True, slots=True)
class LockQuery:
    """Which held locks to read: name lookups (all must match), an order (ties are broken
    by name, so ``-f`` is the exact reverse of ``f``) and a window ``[low:high]``."""

    filters: tuple[Filter, ...] = ()
    ordering: tuple[str, ...] = ("name",)
    low: int = 0
    high: int | None = None

    def __post_init__(self) -> None:
        for lookup, value in self.filters:
            if lookup not in LOOKUPS:
                raise ValueError(f"unknown name lookup {lookup!r}; choose from {LOOKUPS}")
            if lookup == "in" and not isinstance(value, frozenset):
                raise TypeError("an 'in' lookup takes a frozenset of names")
            if lookup != "in" and not isinstance(value, str):
                raise TypeError(f"a {lookup!r} lookup takes a str, not {type(value).__name__}")
        if not self.ordering:
            raise ValueError("a query needs at least one ordering field")
        for field in self.ordering:
            if field.removeprefix("-") not in ORDER_FIELDS:
                raise ValueError(f"cannot order by {field!r}; choose from {ORDER_FIELDS}")

    @property
    def windowed(self) -> bool:
        """True when the query reads a slice rather than every match."""
        return self.low != 0 or self.high is not None


EVERY_LOCK = LockQuery()
"""Every held lock, by name."""


@dataclass(frozen=True, slots=True)
class Page:
    """What one read found: the records of the window, in order, and how many names the
    index matched (locks released since the index was read are left out of ``records``
    but counted in ``matched``)."""

    records: list[LockRecord]
    matched: int


class Listing:
    """Reads the locks held under ``backend``'s prefix (one instance per read or reused;
    it keeps no state between calls)."""

    __slots__ = ("backend",)

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def records(
        self, query: LockQuery = EVERY_LOCK, *, limit: int | None = None
    ) -> list[LockRecord]:
        """The locks of ``query``'s window, in its order (the first ``limit`` of them)."""
        return self.page(query, limit=limit).records

    def page(self, query: LockQuery = EVERY_LOCK, *, limit: int | None = None) -> Page:
        """:meth:`records` with the number of names the index matched."""
        snapshot = self._read_index(query.filters)
        window = _ordered(snapshot, query.ordering)[query.low : query.high]
        if limit is None:
            records = snapshot.records(window)
        else:
            records = snapshot.first_records(window, limit)
        return Page(records, len(snapshot.names))

    def count(self, query: LockQuery = EVERY_LOCK) -> int:
        """How many locks ``query``'s window holds, from the indexes alone (one round trip
        per node, however many locks are held)."""
        if query.filters:
            total = len(self._read_index(query.filters).names)
        else:
            prefix = self.backend.prefix
            calls = [Call(LIST_INDEX, (index_key(prefix, b),), ("#",)) for b in range(BUCKETS)]
            total = sum(
                int(reply[1]) for reply in _answered(self._driver().call_many(calls, READ_TIMEOUT))
            )
        if query.high is not None:
            total = min(total, query.high)
        return max(total - query.low, 0)

    def force_release(self, name: str, token: str) -> bool:
        """Delete lock ``name`` if it still holds ``token`` (the one an operator saw),
        and wake one waiter. ``False`` when it was released or changed hands since:
        nothing is touched then. The evicted holder learns it through its watchdog."""
        name = validate_name(name)
        if not isinstance(token, str) or not token:
            raise ValueError(f"force-releasing {name!r} needs the token it was read with")
        keys = LockKeys.for_name(self.backend.prefix, name)
        steps = release_steps(keys, token, self.backend.tuning.waiter_liveness_ms)
        return SyncDriver(self.backend, name).run(steps)

    def eviction_policy(self) -> str | None:
        """The ``maxmemory-policy`` of a lock server that can evict held locks (anything
        but ``noeviction``; the first such primary's), else ``None`` (also when it cannot
        be read): for listings to warn operators. Never raises."""
        driver = self._driver()
        try:
            nodes = self.backend.topology().nodes()
        except (LockError, *BACKEND_ERRORS):
            return None
        for node in nodes:
            policy = unsafe_eviction_policy(functools.partial(_run_on, driver, node))
            if policy is not None:
                return policy
        return None

    def _driver(self) -> SyncDriver:
        return SyncDriver(self.backend, None)

    def _read_index(self, filters: Sequence[Filter]) -> _Snapshot:
        """The names matching ``filters``, with their lease ends, from one read of the
        indexes (one round trip per node)."""
        prefix = self.backend.prefix
        exact = _exact_names(filters)
        if exact is not None:
            by_bucket: dict[int, list[str]] = {}
            for name in sorted(exact):
                by_bucket.setdefault(bucket_of(name), []).append(name)
            calls = [
                Call(LIST_INDEX, (index_key(prefix, b),), ("=", *names))
                for b, names in by_bucket.items()
            ]
            buckets = list(by_bucket)
        else:
            calls = [Call(LIST_INDEX, (index_key(prefix, b),), ("*",)) for b in range(BUCKETS)]
            buckets = list(range(BUCKETS))
        replies = _answered(self._driver().call_many(calls, READ_TIMEOUT)) if calls else []
        names: list[Raw] = []
        ends: dict[Raw, int] = {}
        now_by_bucket: dict[int, int] = {}
        for bucket, (now_ms, joined) in zip(buckets, replies, strict=True):
            now = int(now_ms)
            now_by_bucket[bucket] = now
            if not joined:
                continue
            flat = joined.split(b"\0" if isinstance(joined, bytes) else "\0")
            bucket_names = flat[0::2]
            names += bucket_names
            for name, score in zip(bucket_names, flat[1::2], strict=True):
                ends[name] = int(score)
        snapshot = _Snapshot(self.backend, names, ends, now_by_bucket)
        snapshot.names = _filtered(snapshot.names, filters)
        return snapshot


def _answered(replies: list[Any]) -> list[Any]:
    """``replies``, unless one of them is an error: then that error is raised."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return replies


def _run_on(driver: SyncDriver, node: Any, *command: Any) -> Any:
    """Run one plain command on ``node``; an error reply is raised (redis-py's own)."""
    reply = driver.pipeline(node, [command])[0]
    if isinstance(reply, BaseException):
        raise reply
    return reply


class _Snapshot:
    """One read of the listing indexes: the matching names (raw), their lease ends then
    (server ms: TTL order is lease-end order, and equal lease ends tie whatever moment
    each bucket was read at), and each bucket's server clock (ms) at the read."""

    __slots__ = ("backend", "ends", "names", "now_by_bucket")

    def __init__(
        self,
        backend: Backend,
        names: list[Raw],
        ends: dict[Raw, int],
        now_by_bucket: dict[int, int],
    ) -> None:
        self.backend = backend
        self.names = names
        self.ends = ends
        self.now_by_bucket = now_by_bucket

    def _read(
        self, names: Sequence[Raw], *, values: bool, scores: bool
    ) -> tuple[list[Raw | None], list[int | None]]:
        """The lock values and/or remaining leases (ms) of ``names``, ``None`` for the
        locks gone; one round trip per node (``MGET`` and ``ZMSCORE`` per bucket, whose
        keys share a slot)."""
        if not names:
            return [], []
        prefix = self.backend.prefix
        by_bucket: dict[int, list[int]] = {}
        decoded = [decode(name) for name in names]
        for i, name in enumerate(decoded):
            by_bucket.setdefault(bucket_of(name), []).append(i)
        driver = SyncDriver(self.backend, None)
        topology = self.backend.topology()
        by_node: dict[Any, list[tuple[int, tuple[Any, ...]]]] = {}
        for bucket, indexes in by_bucket.items():
            node = topology.node_for(index_key(prefix, bucket))
            for start in range(0, len(indexes), MGET_CHUNK):
                chunk = indexes[start : start + MGET_CHUNK]
                if values:
                    command = ("MGET", *(lock_key(prefix, decoded[i]) for i in chunk))
                    by_node.setdefault(node, []).append((bucket, ("v", chunk, command)))
                if scores:
                    command = ("ZMSCORE", index_key(prefix, bucket), *(names[i] for i in chunk))
                    by_node.setdefault(node, []).append((bucket, ("s", chunk, command)))
        read_values: list[Raw | None] = [None] * len(names)
        read_ttls: list[int | None] = [None] * len(names)
        for node, requests in by_node.items():
            replies = _answered(driver.pipeline(node, [request[2] for _, request in requests]))
            for (bucket, (kind, chunk, _)), reply in zip(requests, replies, strict=True):
                now_ms = self.now_by_bucket.get(bucket)
                for i, item in zip(chunk, reply, strict=True):
                    if kind == "v":
                        read_values[i] = item
                    elif item is not None:
                        end = score_ms(item)
                        read_ttls[i] = end - now_ms if now_ms is not None else 0
        return read_values, read_ttls

    def values_of(self, names: Sequence[Raw]) -> list[Raw | None]:
        """The lock values of ``names`` (``None`` for the locks gone)."""
        return self._read(names, values=True, scores=False)[0]

    def records(self, names: Sequence[Raw]) -> list[LockRecord]:
        """The locks ``names``, in that order, leaving out the ones gone."""
        values, ttls = self._read(names, values=True, scores=True)
        records = []
        for name, value, ttl in zip(names, values, ttls, strict=True):
            if ttl is None:
                continue  # released meanwhile (and maybe taken again since)
            record = parse_lock_value(decode(name), value, ttl)
            if record is not None:
                records.append(record)
        return records

    def first_records(self, names: Sequence[Raw], limit: int) -> list[LockRecord]:
        """The first ``limit`` locks of ``names`` that still exist, reading them in
        growing chunks."""
        found: list[LockRecord] = []
        start, step = 0, max(limit, 1)
        while len(found) < limit and start < len(names):
            found += self.records(names[start : start + step])
            start += step
            step = min(step * 4, MGET_CHUNK)
        return found[:limit]


def _filtered(names: list[Raw], filters: Sequence[Filter]) -> list[Raw]:
    """The names matching every one of ``filters``: plain string operations, so glob and
    regex characters in the values are literal. Raw (bytes) names are matched against
    the UTF-8 encoding of the values, which matches exactly the same names."""
    raw = bool(names) and isinstance(names[0], bytes)
    for lookup, value in filters:
        if raw:
            value = frozenset(map(_utf8, value)) if lookup == "in" else _utf8(value)
        if lookup == "exact":
            names = [name for name in names if name == value]
        elif lookup == "startswith":
            names = [name for name in names if name.startswith(value)]
        elif lookup == "contains":
            names = [name for name in names if value in name]
        else:
            names = [name for name in names if name in value]
    return names


def _utf8(value: str) -> bytes:
    # A lone surrogate cannot be in a lock name: encoded anyway, it matches nothing.
    return value.encode("utf-8", "surrogatepass")


def _encodable(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _exact_names(filters: Iterable[Filter]) -> frozenset[str] | None:
    """The only names ``filters`` can match, when an exact or ``in`` lookup bounds them
    (the index is then probed for those names instead of read whole)."""
    names: frozenset[str] | None = None
    for lookup, value in filters:
        if lookup in ("exact", "in"):
            bound = frozenset((value,)) if lookup == "exact" else value
            names = bound if names is None else names & bound
    return None if names is None else frozenset(filter(_encodable, names))


def _ordered(snapshot: _Snapshot, ordering: Sequence[str]) -> list[Raw]:
    """The matching names in ``ordering`` (vanished locks may be left out when the order
    needed their values)."""
    first = ordering[0]
    names = snapshot.names
    if first.removeprefix("-") == "name":
        return sorted(names, reverse=first.startswith("-"))
    fields = {field.removeprefix("-") for field in ordering}
    ends = [snapshot.ends.get(name) for name in names] if "ttl" in fields else [0] * len(names)
    if "acquired_at" in fields:
        # Only the acquisition time is decoded here; the page is parsed later.
        acquired = list(map(lock_value_acquired_at_us, snapshot.values_of(names)))
    else:
        acquired = [0] * len(names)
    rows = [
        row
        for row in zip(names, ends, acquired, strict=True)
        if row[1] is not None and row[2] is not None
    ]
    _sort_rows(rows, ordering)
    return [row[0] for row in rows]


def _sort_rows(rows: list[tuple[Any, ...]], ordering: Sequence[str]) -> None:
    """Sort ``(name, lease_end_ms, acquired_at_us)`` rows in place by ``ordering``; ties
    are broken by name, in the direction of the first field."""
    columns = {"name": 0, "ttl": 1, "acquired_at": 2}
    fields = list(ordering)
    if not any(field.removeprefix("-") == "name" for field in fields):
        fields.append("-name" if fields[0].startswith("-") else "name")
    for field in reversed(fields):  # stable sorts, last key first
        column = columns[field.removeprefix("-")]
        rows.sort(key=lambda row, column=column: row[column], reverse=field.startswith("-"))
